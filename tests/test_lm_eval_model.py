"""The lm-eval model type ``inductionlab`` on a local task and a tiny GQA Llama (2 layers x 8 query heads,
2 KV heads): two heads in one intervention both take effect, the intact type is lm-eval's ``hf`` to the last
digit, bad head selections are one error line before any forward, the registered name and the CLI."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lm_eval")

from inductionlab.core.instrument import ablate  # noqa: E402
from inductionlab.errors import InductionLabError  # noqa: E402
from inductionlab.protocols.lm_eval_tasks import export_lm_eval_tasks, load_lm_eval_tasks  # noqa: E402
from inductionlab.protocols.lm_eval_model import InductionLabLM, parse_ablate  # noqa: E402

TASK = "inductionlab_icl_copy"
A, B = (1, 3), (0, 5)          # two heads of different layers and different KV groups (head // 4)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval_model_tasks")
    export_lm_eval_tasks(d, tasks=["copy"], n_test=10)
    return d


@pytest.fixture(scope="module")
def loaded(word_tokenizer):
    from conftest import make_tiny
    from inductionlab.core.models import LoadedModel, attention_shape
    model = make_tiny("llama", vocab_size=len(word_tokenizer))
    return LoadedModel(model, word_tokenizer, {"name": "tiny-llama", **attention_shape(model.config)})


@pytest.fixture(scope="module")
def requests(task_dir):
    """The loglikelihood requests of 4 documents at 1 shot, built once by lm-eval from the local task."""
    _, built = load_lm_eval_tasks([TASK], include_path=task_dir)
    task = built[TASK][TASK]
    task.set_config(key="num_fewshot", value=1)
    task.set_fewshot_seed(seed=0)
    task.build_all_requests(limit=4)
    assert len({r.doc_id for r in task.instances}) == 4
    return list(task.instances)


def loglikelihoods(lm, requests) -> list[float]:
    """Every request's log-likelihood of its target, in request order."""
    return [float(ll) for ll, _ in lm.loglikelihood(requests, disable_tqdm=True)]


def hf(loaded):
    from lm_eval.models.huggingface import HFLM
    return HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=2)


def test_two_heads_in_one_intervention_both_take_effect(loaded, requests):
    both = loglikelihoods(InductionLabLM(loaded, heads=[A, B], batch_size=2), requests)
    with ablate(loaded.model, [A, B]):                      # computed directly: lm-eval's hf inside our ablation
        direct = loglikelihoods(hf(loaded), requests)
    only_a = loglikelihoods(InductionLabLM(loaded, ablate="L1H3", batch_size=2), requests)
    only_b = loglikelihoods(InductionLabLM(loaded, ablate="L0H5", batch_size=2), requests)
    intact = loglikelihoods(hf(loaded), requests)
    assert len(both) == len(requests) >= 4 and both == direct
    assert both != only_a and both != only_b and only_a != intact and only_b != intact


def test_mean_ablation_takes_the_reference_batch_and_records_it(loaded, requests):
    """``method=mean``: each head's mean output over 8 random ``[BOS] S S`` (evaluate's reference recipe) replaces
    it, as ``ablate(model, heads, "mean", reference_ids=...)`` does directly; the reference is recorded."""
    from inductionlab.protocols.lm_eval_model import reference_ids
    ours = InductionLabLM(loaded, heads=[A, B], method="mean", seed=3, batch_size=2)
    ref = reference_ids(loaded, seed=3)
    assert ref.shape == (8, 101) and (ref[:, 0] == loaded.tokenizer.bos_token_id).all()
    assert (ref[:, 1:51] == ref[:, 51:]).all()                      # S S: the second copy repeats the first
    with ablate(loaded.model, [A, B], "mean", reference_ids=ref):
        direct = loglikelihoods(hf(loaded), requests)
    assert loglikelihoods(ours, requests) == direct != loglikelihoods(InductionLabLM(loaded, heads=[A, B]), requests)
    assert "8 random [BOS] S S sequences (T=50, ordinary tokens, seed 3)" in ours.intervention["reference"]


def test_intact_type_equals_hf_to_the_last_digit(loaded, requests):
    ours = InductionLabLM(loaded, batch_size=2)
    assert ours.heads == [] and ours.intervention["selection"] == "intact"
    assert loglikelihoods(ours, requests) == loglikelihoods(hf(loaded), requests)


@pytest.mark.parametrize("spec, match", [
    ("L2H0", r"layer.*0-1"),                  # the model has layers 0-1
    ("L1H8", r"head.*0-7"),                   # and query heads 0-7
    ("L1-H3", r"not a head selection"),
    ("L1H3,L0H5", r"not a head selection"),
    ("top-17", r"16 heads"),
    ("top-3:nope", r"unknown head score 'nope'"),
    ("L1H3;L1H3", r"names a head twice"),
])
def test_bad_selection_is_one_line_before_any_forward(loaded, spec, match):
    calls = []
    hook = loaded.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(InductionLabError, match=match) as e:
            InductionLabLM(loaded, ablate=spec)
    finally:
        hook.remove()
    assert "\n" not in str(e.value) and calls == []


def test_parse_ablate_grammar():
    assert parse_ablate("top-10:induction") == ("top", (10, "induction"))
    assert parse_ablate("top-4") == ("top", (4, "induction"))
    assert parse_ablate("random-3") == ("random", 3)
    assert parse_ablate("L18H6;L17H3") == ("heads", [(18, 6), (17, 3)])
    assert parse_ablate("L18H6 + L0H0") == ("heads", [(18, 6), (0, 0)])


def test_registered_name_builds_from_model_args(tiny_dir):
    """``--model inductionlab --model_args ...`` as lm-eval builds it: a directory, random heads, mean
    ablation with its reference recorded."""
    from lm_eval.api.registry import get_model
    from inductionlab.core.ablation import random_heads
    from inductionlab.core.stimuli import seed_for

    cls = get_model("inductionlab")
    assert cls is InductionLabLM
    lm = cls.create_from_arg_string(f"pretrained={tiny_dir},ablate=random-3,method=mean,seed=5,dtype=float32",
                                    {"batch_size": 2, "device": "cpu"})
    assert lm.heads == random_heads((2, 8), 3, seed=seed_for(5, 3, 0))       # evaluate's random-all-3-d0 at seed 5
    rec = lm.get_model_info()["inductionlab"]
    assert rec["method"] == "mean" and rec["selection"] == "random-3" and "8 random [BOS] S S" in rec["reference"]
    assert tuple(lm._means.shape[:2]) == (2, 8)


@pytest.mark.slow                   # lm-eval's CLI indexes its ~15k installed task configs first (20-100 s)
def test_cli_passes_through_to_lm_eval(tiny_dir, task_dir, tmp_path):
    from click.testing import CliRunner
    from inductionlab.cli.main import main

    args = ["lm-eval", "run", "--model", "inductionlab", "--tasks", TASK, "--include_path", str(task_dir),
            "--limit", "2", "--num_fewshot", "1", "--batch_size", "2", "--device", "cpu"]
    bad = CliRunner().invoke(main, [*args, "--model_args", f"pretrained={tiny_dir},ablate=L7H0"])
    assert bad.exit_code == 2 and "layer" in bad.output and bad.output.count("error:") == 1
    out = tmp_path / "res"
    ok = CliRunner().invoke(main, [*args, "--model_args", f"pretrained={tiny_dir},ablate=L1H3;L0H5,dtype=float32",
                                   "--output_path", str(out)])
    assert ok.exit_code == 0, ok.output
    res = json.loads(next(out.rglob("results_*.json")).read_text())
    assert res["config"]["inductionlab"]["heads"] == [[1, 3], [0, 5]]
    assert 0.0 <= res["results"][TASK]["acc,none"] <= 1.0


def test_generation_runs_under_the_ablation(loaded):
    """``generate_until`` (KV-cached greedy decoding) under {A, B} equals lm-eval's hf generating inside
    ``ablate(model, [A, B])``, and differs from the intact model's on some prompt."""
    from lm_eval.api.instance import Instance
    words = ["the", "of", "and", "to", "in", "is", "for", "that"]
    reqs = [Instance("generate_until", {}, (" ".join(words[i:i + 4]), {"until": ["."], "max_gen_toks": 3}), i)
            for i in range(3)]
    ours = InductionLabLM(loaded, heads=[A, B], batch_size=2).generate_until(reqs)
    with ablate(loaded.model, [A, B]):
        direct = hf(loaded).generate_until(reqs)
    intact = hf(loaded).generate_until(reqs)
    assert ours == direct and ours != intact
