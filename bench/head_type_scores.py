"""Every head's scores of issue 26 on a real model, without the ablation phases of `study head-types`: the
attention-pattern scores, the four dual-route scores (Feucht et al. 2025; 32 word + 32 random-token + 32 attention
prompts), the attention CRP and its CMR fit (Ji-An et al. 2024), and the FV column of an earlier head-types run's
head_scores.csv ("-" for none). Writes OUT (a CSV with one row per head: a --scores-file for `study routes`,
`analyze --rank-by`) and OUT with .json (top-10 per score, Spearman between scores, top-20 overlaps, the CMR-like
share per layer, costs).

    PYTHONPATH=src .venv/bin/python bench/head_type_scores.py MODEL OLD_HEAD_SCORES_CSV|- OUT.csv [WORD_LENGTHS]

WORD_LENGTHS: the dual-route words' token lengths, comma-separated (default 2,3,4,5; Gemma 3: 2,3,4).
"""
import sys, time, json, numpy as np, pandas as pd, torch
sys.path.insert(0, __import__('os').path.join(__import__('os').path.dirname(__file__), '..', 'src'))
from scipy.stats import spearmanr
from inductionlab import load_model, compute_head_scores
from inductionlab.core.scores import attention_crp
from inductionlab.measures import cmr as C
from inductionlab.protocols.cmr_fit import cmr_grid
from inductionlab.protocols.dual_route import build_prompts, route_scores, ROUTE_SCORES
from inductionlab.studies.configs import HeadScoreConfig
from inductionlab.studies.head_types.config import CMRConfig
torch.set_num_threads(2)
name, old, out = sys.argv[1], sys.argv[2], sys.argv[3]
lengths = tuple(int(x) for x in sys.argv[4].split(",")) if len(sys.argv) > 4 else (2, 3, 4, 5)
lm = load_model(name, dtype="float32")
sc, cc = HeadScoreConfig(), CMRConfig()
seqs = sc.sequences(seed=0)
t = time.time(); hs = compute_head_scores(lm.model, seqs, tokenizer=lm.tokenizer); t_scores = time.time() - t
ind = hs["induction"]; L, H = ind.shape
t = time.time(); crp = attention_crp(lm.model, seqs, tokenizer=lm.tokenizer, max_lag=cc.max_lag); t_crp = time.time() - t
grid = cmr_grid(n_exps=cc.n_exps, n_s0=cc.n_starts); fit = C.fit_cmr(crp.profile, grid)
wp, rp, ap = build_prompts(lm.tokenizer, lm.model.config.vocab_size, n_words=32, n_attention=32, lengths=lengths)
t = time.time(); rs = route_scores(lm.model, wp, rp, ap); t_route = time.time() - t
df = pd.DataFrame([{"layer": l, "head": h, **{n: float(v[l, h]) for n, v in hs.scores.items()}} for l in range(L) for h in range(H)])
for n in ROUTE_SCORES: df[n] = rs.score(n).ravel()
df["cmr_distance"] = fit.distance.ravel(); df["cmr_like"] = np.nan_to_num(1 / (1 + fit.distance), nan=0.0).ravel()
df["cmr_beta_enc"], df["cmr_beta_rec"], df["cmr_gamma_ft"] = fit.beta_enc.ravel(), fit.beta_rec.ravel(), fit.gamma_ft.ravel()
if old != "-":
    o = pd.read_csv(old)[["layer", "head", "fv"]]; df = df.merge(o, on=["layer", "head"], how="left")
df.to_csv(out, index=False)
import platform, transformers
rec = {"model": name, "identity": {k: lm.identity.get(k) for k in ("name", "sha256", "dtype", "n_layers", "n_heads")},
       "params": {"head_scores": vars(sc), "cmr": vars(cc), "route": {"n_words": 32, "n_attention": 32, "seed": 0, "lengths": list(lengths)}},
       "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}, "seconds": {"head_scores": t_scores, "attention_crp": t_crp, "dual_route": t_route, "grid": grid.params.get("seconds")},
       "route_cost": rs.params.get("cost"), "n_cmr_like": int((fit.distance < 0.5).sum()),
       "cmr_share_per_layer": [float(np.mean(fit.distance[l] < 0.5)) for l in range(L)]}
def top(col, k=10): 
    d = df.sort_values(col, ascending=False).head(k); return [f"L{r.layer}H{r.head} {getattr(r, col):.3g}" for r in d.itertuples()]
for c in ["induction", *ROUTE_SCORES, "cmr_like"] + (["fv"] if "fv" in df else []): rec.setdefault("top", {})[c] = top(c)
cols = ["induction", *ROUTE_SCORES, "cmr_like"] + (["fv"] if "fv" in df else [])
rec["spearman"] = {f"{a}~{b}": float(spearmanr(df[a], df[b], nan_policy="omit")[0]) for i, a in enumerate(cols) for b in cols[i+1:]}
s = lambda c: set(df.sort_values(c, ascending=False).head(20).index)
rec["top20_overlap"] = {f"{a}&{b}": len(s(a) & s(b)) for i, a in enumerate(cols) for b in cols[i+1:]}
print(json.dumps(rec, indent=1)); json.dump(rec, open(out.replace(".csv", ".json"), "w"), indent=1)
