"""lm-eval: our tasks exported as local JSONL + YAML run offline on a tiny model; a task whose
dataset is not on disk is a one-line error naming it; unknown names refused."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lm_eval")

from inductionlab.errors import InductionLabError  # noqa: E402
from inductionlab.protocols.icl_tasks import build_task  # noqa: E402
from inductionlab.protocols.lm_eval_tasks import export_lm_eval_tasks, load_lm_eval_tasks, run_lm_eval  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval_tasks")
    names = export_lm_eval_tasks(d, tasks=["copy", "next_letter"], n_test=20)
    return d, names


def test_export_files_hold_the_generated_items(exported):
    import yaml
    d, names = exported
    assert names == ["inductionlab_icl_copy", "inductionlab_icl_next_letter"]
    pool = {(it.x, it.y) for it in build_task("next_letter").items}
    test = [json.loads(line) for line in (d / "next_letter.test.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (d / "next_letter.train.jsonl").read_text().splitlines()]
    assert len(test) == 12 and len(train) == 13                       # 25 items: at most half to test
    assert {(r["x"], r["y"]) for r in test + train} == pool and not {r["x"] for r in test} & {r["x"] for r in train}
    cfg = yaml.safe_load((d / "copy.yaml").read_text())
    assert cfg["task"] == "inductionlab_icl_copy" and cfg["doc_to_text"] == "Q: {{x}}\nA:"
    assert cfg["fewshot_delimiter"] == "\n\n" and cfg["target_delimiter"] == ""


def test_the_scored_continuation_and_the_examples_carry_the_space(exported):
    """lm-eval 0.4 builds a loglikelihood request as (context, doc_to_target) with no delimiter: the target must
    carry its space, or the model is scored on "A:y" (every answer glued to the colon; SmolLM2's copy accuracy was
    0.0 that way). The few-shot examples read "Q: x\nA: y" too."""
    import yaml
    from lm_eval.api.task import ConfigurableTask

    d, _ = exported
    task = ConfigurableTask(config={**yaml.safe_load((d / "copy.yaml").read_text()), "num_fewshot": 2})
    task.set_fewshot_seed(0)
    task.build_all_requests(limit=1, rank=0, world_size=1)
    ctx, cont = task.instances[0].arguments
    doc = task.instances[0].doc
    assert cont == " " + doc["y"] and ctx.endswith(f"Q: {doc['x']}\nA:")
    shots = ctx.split("\n\n")[:-1]
    assert len(shots) == 2 and all(s.startswith("Q: ") and "\nA: " in s and not s.endswith(" ") for s in shots)


def test_local_tasks_run_offline_on_tiny_model(exported, word_tokenizer):
    from conftest import make_tiny
    d, names = exported
    model = make_tiny("llama", vocab_size=len(word_tokenizer))
    r = run_lm_eval(model, word_tokenizer, names, include_path=d, num_fewshot=2, batch_size=4, limit=3)
    assert r["lm_eval_version"].startswith("0.4.") and r["batch_size"] == 4 and r["num_fewshot"] == 2
    for n in names:
        assert 0.0 <= r["results"][n]["acc,none"] <= 1.0
        assert r["n_samples"][n]["effective"] == 3
        assert r["configs"][n]["num_fewshot"] == 2 and r["configs"][n]["fewshot_split"] == "train"


def test_missing_dataset_and_unknown_task_one_line_errors(tmp_path):
    (tmp_path / "gone.yaml").write_text(
        "task: inductionlab_icl_gone\ndataset_path: no-such-org/no-such-dataset\noutput_type: loglikelihood\n"
        "test_split: test\ndoc_to_text: '{{x}}'\ndoc_to_target: '{{y}}'\n")
    with pytest.raises(InductionLabError, match=r"'inductionlab_icl_gone': its dataset no-such-org/no-such-dataset "
                                                r"is not on disk") as e:
        load_lm_eval_tasks(["inductionlab_icl_gone"], include_path=tmp_path)
    assert "\n" not in str(e.value)
    with pytest.raises(InductionLabError, match="unknown lm-eval task.*'inductionlab_icl_nope'"):
        load_lm_eval_tasks(["inductionlab_icl_nope"], include_path=tmp_path)
