"""Nothing silently ignored (issue 36): a value the run would not use is refused with one line, exit status 2 and
nothing written, whether it came from a flag, a ``--config`` file or the API.

Kinds: lm-eval ``model_args`` parsed strictly (unknown key, a key of ``hf`` that acts only on a model it loads, an
empty ``ablate=``, a head cut off at lm-eval's comma split, ``heads=`` as text, a key given twice) and lm-eval's own
errors as one line; an option with no effect in the run (``needs``: ``--cmr-runs`` without ``--cmr``;
``overrides``: ``--icl-pilot`` beside ``--icl-sequences``; a sub-config's leaf the study sets itself: ``lag.seed``);
an exclusive arm that excludes nothing (now at least one head); a misspelt or self-compared ranking of ``study
routes``; a resume after ``--icl-text`` changed in place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json

import numpy as np
import pytest

from test_bad_inputs import refused
from inductionlab.studies.engine import kept
from inductionlab import config as C
from inductionlab.checks import check_effects
from inductionlab.errors import InductionLabError

NO_MODEL = "no-such-model-dir"
COMPUTED = ["--rankings", "induction,previous_token"]      # rankings routes computes itself (no --scores-file)        # a config check that failed to refuse would end on this model, not pass


@pytest.fixture
def victim(tmp_path):
    """A --out folder holding a file: it must be left as it is."""
    out = tmp_path / "victim"
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    return out


# ---- options with no effect: flags --------------------------------------------------------------------------

NO_EFFECT = [
    (["study", "head-types", "--cmr-runs", "5"], "--cmr-runs has no effect without --cmr"),
    (["study", "head-types", "--cmr-top", "3"], "--cmr-top has no effect without --cmr"),
    (["study", "head-types", "--crp-max-lag", "6"], "--crp-max-lag has no effect without --cmr"),
    (["study", "head-types", "--no-dual-route", "--route-prompts", "8"], "--route-prompts has no effect with "
                                                                        "--no-dual-route"),
    (["study", "head-types", "--no-dual-route", "--route-word-lengths", "2,3"], "--route-word-lengths has no effect"),
    (["study", "head-types", "--icl-sequences", "4", "--icl-pilot", "4"], "--icl-pilot and --icl-sequences conflict"),
    (["study", "head-types", "--icl-sequences", "4", "--budget-minutes", "3"], "--budget-minutes and --icl-sequences"),
    (["study", "head-types", "--icl-sequences", "4", "--icl-half-width", "0.2"], "--icl-half-width and --icl-seq"),
    (["study", "head-types", "--exclude-fraction", "0"], r"--exclude-fraction 0.0 must be in \(0, 1\)"),
    (["study", "routes", "--no-dual-route"], "no such option"),                   # routes has no dual-route switch
    (["study", "routes", *COMPUTED, "--ks", "1", "--fractions", "0.1"], "--fractions and --ks conflict"),
    (["study", "routes", *COMPUTED, "--token-ranking", "inducton"], "--token-ranking inducton: not one of --rankings"),
    (["study", "routes", *COMPUTED, "--cmr-ranking", "sink"], "--cmr-ranking sink: not one of --rankings"),
    (["study", "routes", *COMPUTED, "--concept-ranking", "induction"],
     "--token-ranking and --concept-ranking are both induction: the claims would compare a ranking with itself"),
    (["study", "routes", *COMPUTED, "--concept-ranking", "previous_token", "--cmr-ranking", "previous_token"],
     "--concept-ranking and --cmr-ranking are both previous_token"),
    (["analyze", "--exclude-fraction", "0.1"], "--exclude-fraction has no effect without --exclude-by"),
    (["analyze", "--exclude-fraction", "0.02"], "--exclude-fraction has no effect without --exclude-by"),  # default
    (["evaluate", "--lm-eval-limit", "5"], "--lm-eval-limit has no effect without --lm-eval-tasks"),
]


@pytest.mark.parametrize("args, pattern", NO_EFFECT, ids=[" ".join(a[:2] + [x for x in a[2:] if x.startswith("--")
                                                                          and x != "--rankings"][:2]) for a, _ in NO_EFFECT])
def test_an_option_with_no_effect_is_refused(victim, args, pattern):
    refused([*args, "--model", NO_MODEL, "--out", victim], pattern, victim.parent)


def test_telemetry_head_type_options_need_head_types(tmp_path, victim):
    """``telemetry RUN --head-types-words 4`` without ``--head-types``: refused before the run is read (its folder,
    which would hold OUT = RUN/telemetry, untouched)."""
    for flag, value in (("--head-types-words", "4"), ("--head-types-batch", "4"), ("--head-types-cmr-runs", "3"),
                        ("--induction-threshold", "0.3")):
        refused(["telemetry", victim, flag, value], f"{flag} has no effect without --head-types", victim.parent)


# ---- the same values from a --config file (value-based: the file has no flags) -------------------------------

FILE_NO_EFFECT = [
    (["study", "head-types"], {"cmr": {"n_exps": 5}}, "--cmr-runs has no effect without --cmr"),
    (["study", "head-types"], {"route.enabled": False, "route.n_words": 8}, "--route-prompts has no effect with "
                                                                            "--no-dual-route"),
    (["study", "head-types"], {"icl": {"n_sequences": 4, "pilot": 8}}, "--icl-pilot and --icl-sequences conflict"),
    (["study", "head-types"], {"lag.seed": 3}, r"config key 'lag.seed' = 3 is not used: the study sets it from "
                                               "--seed"),
    (["study", "head-types"], {"lag.method": "mean"}, "config key 'lag.method' .* from --lag-method"),
    (["study", "head-types"], {"fv": {"seed": 1}}, "config key 'fv.seed'"),
    (["study", "head-types"], {"route.seed": 1}, "config key 'route.seed'"),
    (["study", "head-types"], {"lag.pool_size": 100}, "config key 'pool_size' has no effect without "
                                                       "--resample-words"),
    (["study", "routes", *COMPUTED], {"selection": {"ks": [1], "fractions": [0.1]}}, "--fractions and --ks conflict"),
    (["study", "routes", *COMPUTED], {"copy.seed": 2}, "config key 'copy.seed'"),
    (["study", "routes", *COMPUTED], {"recall.method": "mean"}, "config key 'recall.method' .* from --method"),
    (["study", "temporal"], {"lag.positions": "last"}, "config key 'lag.positions' .* from --positions"),
    (["analyze"], {"lag": {"seed": 9}}, "config key 'lag.seed'"),
    (["analyze"], {"ablation.exclude_fraction": 0.1}, "--exclude-fraction has no effect without --exclude-by"),
    (["evaluate"], {"lm_eval": {"limit": 5}}, "--lm-eval-limit has no effect without --lm-eval-tasks"),
]


@pytest.mark.parametrize("command, values, pattern", FILE_NO_EFFECT,
                         ids=[f"{' '.join(c)} {next(iter(v))}" for c, v, _ in FILE_NO_EFFECT])
def test_a_config_file_value_with_no_effect_is_refused(tmp_path, victim, command, values, pattern):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(values))
    refused([*command, "--config", cfg, "--model", NO_MODEL, "--out", victim], pattern, victim.parent)


def test_telemetry_config_file_head_type_values_need_head_types(tmp_path, victim):
    from inductionlab.studies.telemetry.config import TelemetryConfig

    cfg = C.from_dict(TelemetryConfig, {"runs": [str(victim)], "head_types": {"n_words": 4}})
    with pytest.raises(InductionLabError, match="--head-types-words has no effect without --head-types"):
        cfg.validate()


def test_the_api_refuses_the_same_values():
    """The check is the configs' own (``validate()``), so the Python API refuses what the command line does."""
    from inductionlab.protocols.configs import LagProbeConfig
    from inductionlab.studies.head_types.config import CMRConfig, HeadTypesConfig
    from inductionlab.studies.routes.config import RoutesConfig, RoutesSelectionConfig

    RANKS = ("induction", "previous_token")

    with pytest.raises(InductionLabError, match="--cmr-runs has no effect without --cmr"):
        HeadTypesConfig(cmr=CMRConfig(n_exps=3)).validate()
    with pytest.raises(InductionLabError, match="config key 'lag.seed'"):
        HeadTypesConfig(lag=LagProbeConfig(n_permutations=16, cues="all:10", seed=4)).validate()
    with pytest.raises(InductionLabError, match="--fractions and --ks conflict"):
        RoutesConfig(selection=RoutesSelectionConfig(rankings=RANKS, ks=(2,), fractions=(0.1,))).validate()
    HeadTypesConfig(cmr=CMRConfig(enabled=True, n_exps=3)).validate()           # with the switch: accepted
    RoutesConfig(selection=RoutesSelectionConfig(rankings=RANKS, ks=(2,))).validate()


def test_every_needs_and_overrides_names_a_leaf_of_its_config_and_every_default_passes():
    """The metadata is checked against the configs (a typo in ``needs=`` is a TypeError, not a silent no-op), and
    no study's default config (nor a Bi-Induct preset's evaluation) trips its own check."""
    from inductionlab.studies.spec import specs

    seen = 0

    def walk(cfg):
        nonlocal seen
        check_effects(cfg)
        fields = {C.flag_of(f) for f in dataclasses.fields(cfg)}
        for f in dataclasses.fields(cfg):
            for o in (f.metadata.get("needs"), *([f.metadata["overrides"]] if isinstance(f.metadata.get("overrides"), str)
                                                 else f.metadata.get("overrides") or ())):
                if o:
                    assert o in fields, f"{type(cfg).__name__}.{f.name}: {o}"
                    seen += 1
            v = getattr(cfg, f.name)
            if dataclasses.is_dataclass(v) and not isinstance(v, type):
                walk(v)

    for spec in specs():
        presets = getattr(spec.config, "PRESETS", None) or {}
        for cfg in [p() for p in presets.values()] or [C.default(spec.config)]:
            if presets:
                walk(cfg.evaluation)
            else:
                walk(cfg)
    assert seen >= 20


def test_check_effects_rules_on_a_toy_config():
    """needs: set while the needed leaf is off; overrides: both set; owns: a sub-leaf away from its default."""
    @dataclasses.dataclass
    class Sub:
        seed: int = C.opt(0, "")
        n: int = C.opt(1, "")

    @dataclasses.dataclass
    class Toy:
        on: bool = C.opt(False, "", flag="--on")
        runs: int = C.opt(10, "", needs="--on")
        auto: int | None = C.opt(None, "", flag="--fixed", overrides=("--runs",))
        sub: Sub = C.nested(Sub, "", owns={"seed": "--seed"})

    check_effects(Toy())
    check_effects(Toy(on=True, runs=3))
    check_effects(Toy(sub=Sub(n=4)))
    with pytest.raises(InductionLabError, match="--runs has no effect without --on"):
        check_effects(Toy(runs=3))
    with pytest.raises(InductionLabError, match="--runs and --fixed conflict"):
        check_effects(Toy(on=True, runs=3, auto=5))
    with pytest.raises(InductionLabError, match="config key 'sub.seed' = 2 is not used"):
        check_effects(Toy(sub=Sub(seed=2)))

    @dataclasses.dataclass
    class Broken:
        n: int = C.opt(1, "", needs="--nosuch")

    with pytest.raises(TypeError, match="needs --nosuch"):
        check_effects(Broken(n=2))


# ---- an exclusive arm that excludes nothing -------------------------------------------------------------------

@pytest.mark.parametrize("n_total, fraction, expected", [
    (8, 0.02, 1),          # int(0.16) = 0: the authors' rule would exclude no head
    (49, 0.02, 1),         # int(0.98) = 0
    (72, 0.02, 1),         # Gemma 3 270M: int(1.44) = 1
    (270, 0.02, 5),        # SmolLM2-135M: int(5.4) = 5
    (100, 0.1, 10),
    (100, 0.0, 0),         # no exclusion
])
def test_excluded_count_is_at_least_one_head(n_total, fraction, expected):
    from inductionlab.core.ablation import excluded_count

    assert excluded_count(n_total, fraction) == expected


def test_an_exclusive_arm_on_few_heads_differs_from_the_plain_one():
    """8 heads, the default 2 %: the top FV head is also the top induction head, so excluding induction's top one
    head changes the FV selection; before, int(0.02 x 8) = 0 made both arms the same heads."""
    from inductionlab.core.ablation import selection_conditions

    fv = np.array([[0.9, 0.1, 0.2, 0.3], [0.4, 0.5, 0.6, 0.05]])
    ind = np.array([[0.95, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])         # induction's top head: (0, 0)
    conds = {c.name: c.heads for c in selection_conditions(fv, fractions=(0.25,), exclude_scores=ind,
                                                           exclude_label="induction", n_draws=0)}
    assert conds["fv-25pct"] == [(0, 0), (1, 2)]                          # the two best FV heads
    assert conds["fv-excl-induction-25pct"] == [(1, 2), (1, 1)]            # (0, 0) excluded: the next two


def test_the_report_says_how_many_heads_were_excluded():
    from inductionlab.studies.head_types.report import _excluded

    assert _excluded({"exclusion": {"heads_excluded": 1, "of_heads": 8}}) == "1 of 8 head"
    assert _excluded({"exclusion": {"heads_excluded": 5, "of_heads": 270}}) == "5 of 270 heads"
    assert _excluded({}) == "count not recorded"


def test_routes_fractions_of_one_count_are_refused():
    from inductionlab.studies.routes.config import RoutesSelectionConfig

    assert RoutesSelectionConfig(fractions=(0.05, 0.25)).sizes(8) == [1, 2]
    with pytest.raises(InductionLabError, match="--fractions 0.05 and 0.1 both ablate 1 of the model's 8 heads"):
        RoutesSelectionConfig(fractions=(0.05, 0.1)).sizes(8)


# ---- --icl-text changed in place --------------------------------------------------------------------------------

def test_the_icl_text_hash_is_part_of_the_runs_identity(tmp_path):
    """The token-loss plan's params carry the SHA-256 of the text file's bytes (a resume compares params, so a file
    changed in place is refused: the run directory's own test covers that comparison); ``demo`` adds nothing."""
    from inductionlab.protocols import token_loss as P
    from inductionlab.protocols.configs import TokenLossConfig
    from inductionlab.runtime.runs import ResumableRun

    text = tmp_path / "t.txt"
    text.write_text("one two three " * 50)
    cfg = TokenLossConfig(text=str(text))
    first = P.text_sha256(cfg)
    assert first == hashlib.sha256(text.read_bytes()).hexdigest()
    assert P.text_sha256(TokenLossConfig(text="demo")) is None
    out = tmp_path / "run"
    run = ResumableRun(out, "study-head-types", {"icl_text_sha256": first})
    run.open()
    kept(run, "piece", lambda: {"x": np.zeros(1)})
    text.write_text("four five six " * 50)                                  # changed in place, same path
    second = P.text_sha256(cfg)
    assert second != first
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(InductionLabError, match="different parameters \\(icl_text_sha256\\)") as e:
        ResumableRun(out, "study-head-types", {"icl_text_sha256": second}).open()
    assert "\n" not in str(e.value) and sorted(p.name for p in out.iterdir()) == before
    ResumableRun(out, "study-head-types", {"icl_text_sha256": second}, overwrite=True).open()   # afresh


# ---- lm-eval model_args -------------------------------------------------------------------------------------------

lm_eval = pytest.importorskip("lm_eval")


def _lm():
    from inductionlab.protocols.lm_eval_model import InductionLabLM
    return InductionLabLM


MODEL_ARGS = [
    ("pretrained=PATH,metod=mean", "unknown model argument 'metod' .*did you mean 'method'.*known: pretrained, ablate"),
    ("pretrained=PATH,ablate=", "ablate= is empty"),
    ("pretrained=PATH,ablate=L0H1,L0H2", "'L0H2' has no value: lm-eval splits model_args at commas.*; or \\+"),
    ("pretrained=PATH,ablate=L0H1,top-3", "'top-3' has no value"),
    ("pretrained=PATH,revision=main", "revision= has no effect with --model inductionlab"),
    ("pretrained=PATH,peft=x", "peft= has no effect"),
    ("pretrained=PATH,heads=top-3", "heads='top-3' is not a list of heads"),
    ("pretrained=PATH,heads=", "heads= is empty"),
    ("pretrained=PATH,tokenizer=gpt2", "tokenizer= has no effect with pretrained= a name or path"),
]


@pytest.mark.parametrize("args, pattern", MODEL_ARGS, ids=[a.split(",", 1)[1] for a, _ in MODEL_ARGS])
def test_model_args_are_parsed_strictly(tiny_dir, args, pattern):
    """Refused before the model loads (a load would take the path; these name the argument instead)."""
    with pytest.raises(InductionLabError, match=pattern) as e:
        _lm().create_from_arg_string(args.replace("PATH", str(tiny_dir)), {"batch_size": 1, "device": "cpu"})
    assert "\n" not in str(e.value)


def test_a_key_set_twice_by_model_args_and_lm_eval_is_refused(tiny_dir):
    with pytest.raises(InductionLabError, match="device=cpu and lm-eval's --device cpu both set device"):
        _lm().create_from_arg_obj({"pretrained": str(tiny_dir), "device": "cpu"}, {"device": "cpu", "batch_size": 1})
    with pytest.raises(InductionLabError, match="batch_size=4 and lm-eval's --batch_size 1"):
        _lm().create_from_arg_string(f"pretrained={tiny_dir},batch_size=4", {"batch_size": 1, "device": None})


def test_heads_as_text_are_parsed(tiny_dir):
    lm = _lm().create_from_arg_obj({"pretrained": str(tiny_dir), "heads": "L1H3;L0H5", "dtype": "float32"},
                                   {"batch_size": 1, "device": "cpu"})
    assert lm.heads == [(1, 3), (0, 5)] and lm.intervention["selection"] == "heads"


def test_every_hf_argument_is_classified():
    """Each keyword of lm-eval's ``HFLM`` is either passed on (acts on a loaded model), refused as loading-only, or
    ours: a new lm-eval keyword fails here until it is placed."""
    from lm_eval.models.huggingface import HFLM
    from inductionlab.protocols.lm_eval_model import HF_ARGS, HF_LOADING_ARGS, OWN_ARGS

    params = set(inspect.signature(HFLM.__init__).parameters) - {"self", "kwargs"}
    assert params <= set(HF_ARGS) | set(HF_LOADING_ARGS) | set(OWN_ARGS), params - set(HF_ARGS + HF_LOADING_ARGS
                                                                                       + OWN_ARGS)
    assert not set(HF_ARGS) & set(HF_LOADING_ARGS)


def test_cli_refuses_a_head_cut_at_a_comma_before_lm_eval_runs(tiny_dir, victim):
    refused(["lm-eval", "run", "--model", "inductionlab", "--model_args", f"pretrained={tiny_dir},ablate=L0H1,L0H2",
             "--tasks", "nosuch", "--output_path", victim], "piece 'L0H2' has no '='.*separate heads with ; or \\+",
            victim.parent)


def test_cli_turns_lm_eval_parser_errors_into_one_line(victim):
    refused(["lm-eval", "run", "--model", "inductionlab", "--limit", "abc", "--output_path", victim],
            "lm-eval: .*--limit.*invalid float value", victim.parent)


@pytest.mark.slow                   # lm-eval's CLI indexes its ~15k installed task configs first (20-100 s)
def test_cli_turns_lm_eval_errors_into_one_line(tiny_dir, victim, tmp_path):
    from inductionlab.protocols.lm_eval_tasks import export_lm_eval_tasks

    tasks = tmp_path / "tasks"
    export_lm_eval_tasks(tasks, tasks=["copy"], n_test=4)
    base = ["lm-eval", "run", "--model", "inductionlab", "--output_path", victim, "--device", "cpu",
            "--include_path", tasks]
    refused([*base, "--model_args", f"pretrained={tiny_dir}", "--tasks", "nosuch"],
            "lm-eval: Tasks not found: nosuch", victim.parent)
    refused([*base, "--model_args", f"pretrained={tiny_dir},device=cpu", "--tasks", "inductionlab_icl_copy"],
            "device=cpu and lm-eval's --device cpu both set device", victim.parent)
