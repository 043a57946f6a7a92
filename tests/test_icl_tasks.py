"""ICL tasks: every item's answer re-derived by another route, prompts well formed, the
label-permutation control a true derangement, the first answer token as defined."""

from __future__ import annotations

import re

import numpy as np
import pytest

from inductionlab.errors import InductionLabError
from inductionlab.protocols.icl_tasks import (TASK_NAMES, Item, answer_tokens, build_task, build_tasks, derangement,
                                    format_prompt, make_prompts)


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A byte-level BPE (GPT-2 style: leading-space tokens) trained on the tasks' own text."""
    from transformers import PreTrainedTokenizerFast

    from inductionlab.data.tokenizer import train_bpe
    texts = [format_prompt([it], it.x) for t in build_tasks().values() for it in t.items]
    info = train_bpe(texts, 1500)
    return PreTrainedTokenizerFast(tokenizer_object=info.tokenizer, eos_token="<|endoftext|>")


def _check(task: str, x: str, y: str) -> bool:
    """Independent answer check: chr/ord arithmetic, word2number, lemminflect, slicing."""
    from word2number import w2n
    up = lambda s: "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in s)  # noqa: E731
    if task == "capitalize":
        return y == up(x[0]) + x[1:]
    if task == "uppercase":
        return y == up(x) and y != x
    if task == "first_letter":
        return len(y) == 1 and x.startswith(y)
    if task == "last_letter":
        return len(y) == 1 and x.endswith(y)
    if task == "next_letter":
        return len(x) == len(y) == 1 and "a" <= x < "z" and ord(y) == ord(x) + 1
    if task == "prev_letter":
        return len(x) == len(y) == 1 and "a" < x <= "z" and ord(y) == ord(x) - 1
    if task == "next_number":
        return x.isdigit() and y.isdigit() and int(y) == int(x) + 1
    if task == "digit_to_word":
        return x.isdigit() and not any(c.isdigit() for c in y) and w2n.word_to_num(y) == int(x)
    if task == "word_to_digit":
        return y.isdigit() and w2n.word_to_num(x) == int(y)
    if task == "plural":
        import lemminflect
        return y != x and x in lemminflect.getAllLemmas(y, upos="NOUN").get("NOUN", ())
    if task == "copy":
        return y == x
    if task in ("list_first", "list_last"):
        parts = x.split(", ")
        return len(parts) == 3 == len(set(parts)) and y == parts[0 if task == "list_first" else -1]
    raise AssertionError(task)


def test_at_least_ten_tasks_and_every_answer_independently_right():
    tasks = build_tasks()
    assert len(tasks) >= 10 and set(tasks) == set(TASK_NAMES)
    for name, t in tasks.items():
        assert len(t.items) >= 25, name
        assert len({it.x for it in t.items}) == len(t.items), name      # inputs distinct
        bad = [it for it in t.items if not _check(name, it.x, it.y)]
        assert not bad, (name, bad[:3])


def test_plural_has_irregular_nouns_and_no_pronouns():
    items = {it.x: it.y for it in build_task("plural").items}
    assert items.get("man") == "men" and items.get("city") == "cities"
    assert not {"she", "her", "that", "your"} & set(items)


def test_unknown_task_is_one_line_error():
    with pytest.raises(InductionLabError, match="unknown ICL task.*'nope'"):
        build_tasks(["copy", "nope"])


def test_derangement_has_no_fixed_point_and_is_uniformish():
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(300):
        p = derangement(3, rng)
        assert sorted(p) == [0, 1, 2] and not any(p == np.arange(3))
        seen.add(tuple(p))
    assert seen == {(1, 2, 0), (2, 0, 1)}   # the only two derangements of 3
    with pytest.raises(ValueError):
        derangement(1, rng)


def test_answer_token_definition(bpe_tokenizer):
    tok = bpe_tokenizer
    ids, t = answer_tokens(tok, "Q: city\nA:", "cities")
    assert ids == tok.encode("Q: city\nA:")
    full = tok.encode("Q: city\nA: cities")
    assert full[:len(ids) + 1] == ids + [t]
    assert (" cities").startswith(tok.decode([t])) and tok.decode([t]).strip()


def test_answer_token_skips_whitespace_only_tokens():
    """A tokenizer that writes " 7" as " ", "7" (SmolLM2): the space joins the input."""
    class SplitSpace:
        def encode(self, s, add_special_tokens=False):
            return [ord(c) for c in s]          # one token per character
        def decode(self, ids):
            return "".join(chr(i) for i in ids)
    ids, t = answer_tokens(SplitSpace(), "Q: 6\nA:", "7")
    assert ids == [ord(c) for c in "Q: 6\nA: "] and t == ord("7")


PROMPT_RE = re.compile(r"((?:Q: [^\n]+\nA: [^\n]+\n\n)*)Q: ([^\n]+)\nA:")


@pytest.mark.parametrize("task", TASK_NAMES)
def test_prompts_well_formed_and_control_permutes(task, bpe_tokenizer):
    t = build_task(task)
    prompts = make_prompts(t, bpe_tokenizer, shots=(0, 1, 4), n_prompts=6, seed=3)
    by = {(p.shots, p.control, p.index): p for p in prompts}
    assert {(k, c) for k, c, _ in by} == {(0, "intact"), (1, "intact"), (4, "intact"), (4, "permuted")}
    for p in prompts:
        m = PROMPT_RE.fullmatch(p.text)
        assert m, p.text
        demos = re.findall(r"Q: ([^\n]+)\nA: ([^\n]+)\n\n", m.group(1))
        assert len(demos) == p.shots and m.group(2) == p.query.x
        assert _check(task, p.query.x, p.query.y)
        assert p.query.x not in [x for x, _ in demos]
        assert p.input_ids == answer_tokens(bpe_tokenizer, p.text, p.query.y)[0]
        assert (" " + p.query.y).startswith(bpe_tokenizer.decode(p.input_ids[len(bpe_tokenizer.encode(p.text)):]
                                                                 + [p.target_id]))
        if p.control == "intact":
            assert all(_check(task, x, y) for x, y in demos)
            assert len({y for _, y in demos}) == len(demos)            # distinct answers
        else:
            intact = by[(p.shots, "intact", p.index)]
            assert [d.x for d in p.demos] == [d.x for d in intact.demos] and p.query == intact.query
            assert sorted(y for _, y in demos) == sorted(d.y for d in intact.demos)
            assert all(y != d.y for (_, y), d in zip(demos, intact.demos))   # nobody keeps its label


def test_prompts_seeded_and_bad_shots(bpe_tokenizer):
    t = build_task("next_letter")
    a = make_prompts(t, bpe_tokenizer, shots=(2,), n_prompts=5, seed=1)
    b = make_prompts(t, bpe_tokenizer, shots=(2,), n_prompts=5, seed=1)
    c = make_prompts(t, bpe_tokenizer, shots=(2,), n_prompts=5, seed=2)
    assert [p.text for p in a] == [p.text for p in b] != [p.text for p in c]
    with pytest.raises(InductionLabError, match="shots must be >= 0"):
        make_prompts(t, bpe_tokenizer, shots=(-1,))
    with pytest.raises(InductionLabError, match="next_letter.*fewer shots"):
        make_prompts(t, bpe_tokenizer, shots=(30,))


def test_prompt_bos_prefix(bpe_tokenizer):
    p = make_prompts(build_task("copy"), bpe_tokenizer, shots=(1,), n_prompts=1, bos_id=7)[0]
    q = make_prompts(build_task("copy"), bpe_tokenizer, shots=(1,), n_prompts=1)[0]
    assert p.input_ids == [7] + q.input_ids and p.target_id == q.target_id
    assert Item("a", "b") == Item("a", "b")
