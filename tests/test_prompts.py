"""jaxpipe.prompts: prompts as arrays that cross jit, prompt files, splits and fixed-shape batches."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpipe import prompts as jpp
from jaxpipe.card import Card, CardSpec
from jaxpipe.cards import registry
from jaxpipe.prompts import Prompts, PromptSet
from jaxpipe.request import Request

TEXTS = ["seven thick", "café au lait", "数字 七 🎲", "", "one"]


def small_prompts(texts=("seven thick", "one", "two dim"), width=64, **metadata):
    return jpp.check(
        Prompts(
            np.arange(len(texts) * 4, dtype=np.int32).reshape(len(texts), 4),
            jpp.encode_text(list(texts), width),
            metadata,
        )
    )


# ------------------------------------------------------------------------------------ text bytes
def test_text_round_trips_exactly_including_non_ascii():
    rows = jpp.encode_text(TEXTS, 64)
    assert rows.shape == (5, 64) and rows.dtype == np.uint8
    assert jpp.decode_text(rows) == TEXTS
    assert jpp.decode_text(jpp.encode_text(["é" * 32], 64)) == ["é" * 32]  # exactly 64 bytes fits


def test_too_long_prompts_error_instead_of_truncating():
    with pytest.raises(ValueError, match="prompt 1 is 66 UTF-8 bytes, longer than the text width 64"):
        jpp.encode_text(["ok", "é" * 33], 64)
    with pytest.raises(ValueError, match="NUL"):
        jpp.encode_text(["a\x00b"], 64)
    with pytest.raises(TypeError, match="one string"):
        jpp.encode_text("seven", 64)


def test_text_width_rounds_up_to_64_bytes():
    assert jpp.text_width([""]) == 64
    assert jpp.text_width(["a" * 64]) == 64
    assert jpp.text_width(["a", "é" * 40]) == 128


# ------------------------------------------------------------------------------------ Prompts
def test_prompts_repeat_take_and_strings():
    p = small_prompts(digit=np.array([7, 1, 2], np.int32), target=np.ones((3, 2), np.float32))
    assert len(p) == 3 and p.strings() == ["seven thick", "one", "two dim"]
    r = p.repeat(2)
    assert r.strings() == ["seven thick", "seven thick", "one", "one", "two dim", "two dim"]
    np.testing.assert_array_equal(r.ids[2 * 1 + 1], p.ids[1])  # row p·k + j is copy j of prompt p
    np.testing.assert_array_equal(r.metadata["digit"], [7, 7, 1, 1, 2, 2])
    assert r.metadata["target"].shape == (6, 2)
    t = p.take(np.array([2, 0]))
    assert t.strings() == ["two dim", "seven thick"] and t.metadata["digit"].tolist() == [2, 7]
    with pytest.raises(ValueError, match="positive int"):
        p.repeat(0)


def test_prompts_cross_jit_and_strings_is_host_only():
    p = small_prompts(digit=np.array([7, 1, 2], np.int32))
    out = jax.jit(lambda q: jpp.check(q).repeat(2))(p)  # a pytree in and out; repeat works traced
    assert isinstance(out, Prompts) and out.strings() == p.repeat(2).strings()
    np.testing.assert_array_equal(out.metadata["digit"], [7, 7, 1, 1, 2, 2])
    with pytest.raises(TypeError, match=r"Prompts.strings\(\) .* runs on the host"):
        jax.jit(lambda q: q.strings())(p)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(ids=np.zeros((3,), np.int32)), r"ids must be \(P, L\) int32"),
        (dict(ids=np.zeros((3, 4), np.int64)), r"ids must be \(P, L\) int32"),
        (dict(text=np.zeros((3, 64), np.int32)), r"text must be \(P, W\) uint8"),
        (dict(text=np.zeros((2, 64), np.uint8)), "text has 2 rows but ids has 3"),
        (dict(metadata={"digit": np.zeros((2,), np.int32)}), r"metadata\['digit'\] must have one row per prompt"),
        (dict(metadata={"digit": np.array(["a", "b", "c"])}), r"metadata\['digit'\] must be a numeric array"),
    ],
)
def test_check_names_the_problem(change, message):
    p = small_prompts()
    fields = dict(ids=p.ids, text=p.text, metadata={}) | change
    with pytest.raises(ValueError, match=message):
        jpp.check(Prompts(**fields))


# ------------------------------------------------------------------------------------ tokenize
def test_tokenize_gives_the_ids_the_card_serves(t2i_card):
    texts = ["seven thick", "one", "two dim left"]
    ids = jpp.tokenize(t2i_card, texts)
    program = registry.default_program(t2i_card)
    served = [np.asarray(program.bind(t2i_card, Request(t2i_card.model_id, prompt=t)).slots["ids"]) for t in texts]
    assert ids.dtype == np.int32 and ids.shape == (3, served[0].shape[1])
    np.testing.assert_array_equal(ids, np.concatenate(served))
    with pytest.raises(ValueError, match="unknown word.*'purple'"):
        jpp.tokenize(t2i_card, ["seven", "seven purple"])


def test_tokenize_needs_a_program_that_reads_ids():
    scorer_like = Card(
        {}, CardSpec("scorer-like", "digit_scorer", loops=())
    )  # the digit scorer's program reads an image
    with pytest.raises(ValueError, match="program 'score' takes no token ids"):
        jpp.tokenize(scorer_like, ["one"])


# ------------------------------------------------------------------------------------ files
def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_read_txt_skips_blank_and_comment_lines(tmp_path):
    path = write(tmp_path, "p.txt", ["# my prompts", "seven thick", "", "  one  ", "   # indented comment", "café 七"])
    s = PromptSet.read(path)
    assert s.texts == ("seven thick", "one", "café 七") and len(s) == 3 and dict(s.metadata) == {}
    assert jpp.load(str(path)).texts == s.texts
    with pytest.raises(ValueError, match="no prompts"):
        jpp.read(write(tmp_path, "empty.txt", ["# nothing", ""]))


def test_read_jsonl_with_metadata(tmp_path):
    rows = [
        {"prompt": "seven thick", "digit": 7, "score": 0.5, "box": [1, 2]},
        {"prompt": "one", "digit": 1, "score": 1, "box": [3, 4]},
    ]
    path = write(tmp_path, "p.jsonl", [json.dumps(rows[0]), "", json.dumps(rows[1], ensure_ascii=False)])
    s = jpp.read(path)
    assert s.texts == ("seven thick", "one")
    assert s.metadata["digit"].dtype == np.int32 and s.metadata["digit"].tolist() == [7, 1]
    assert s.metadata["score"].dtype == np.float32 and s.metadata["score"].tolist() == [0.5, 1.0]
    assert s.metadata["box"].shape == (2, 2)
    with pytest.raises(ValueError):
        s.metadata["digit"][0] = 3  # read-only


@pytest.mark.parametrize(
    "second, message",
    [
        ("{not json", r"p.jsonl:3: not valid JSON"),
        ('["seven"]', r"p.jsonl:3: each line must be a JSON object"),
        ('{"digit": 2}', r"p.jsonl:3: no \"prompt\" key"),
        ('{"prompt": 7, "digit": 2}', r"p.jsonl:3: \"prompt\" must be a string"),
        ('{"prompt": "two", "digit": "two"}', r"p.jsonl:3: 'digit' must be a number or a fixed-length list"),
        ('{"prompt": "two", "digit": null}', r"p.jsonl:3: 'digit' must be a number"),
        ('{"prompt": "two"}', r"p.jsonl:3: metadata keys differ from line 1's \['digit'\]: missing \['digit'\]"),
        ('{"prompt": "two", "digit": 2, "x": 1}', r"p.jsonl:3: .* unexpected \['x'\]"),
        ('{"prompt": "two", "digit": [2, 3]}', r"p.jsonl:3: 'digit' has shape \(2,\), but line 1 has \(\)"),
        ('{"prompt": "two", "digit": [[2], [3, 4]]}', r"p.jsonl:3: 'digit' .* ragged"),
    ],
)
def test_read_jsonl_errors_name_the_file_and_line(tmp_path, second, message):
    path = write(tmp_path, "p.jsonl", ['{"prompt": "one", "digit": 1}', "", second])
    with pytest.raises(ValueError, match=message):
        jpp.read(path)


def test_read_and_load_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unsupported prompt file suffix '.csv'"):
        jpp.read(write(tmp_path, "p.csv", ["one"]))
    with pytest.raises(FileNotFoundError, match="no prompt file"):
        jpp.read(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match=r"pass a list: \['seven thick'\]"):
        jpp.load("seven thick")
    with pytest.raises(TypeError, match="file path, a list of strings or a PromptSet"):
        jpp.load(7)
    s = jpp.load(["one", "two"])
    assert jpp.load(s) is s and s.texts == ("one", "two")


# ------------------------------------------------------------------------------------ split
def test_split_is_deterministic_disjoint_and_covers_the_set():
    s = PromptSet.from_list([f"p{i}" for i in range(20)], {"i": np.arange(20)})
    train, held = s.split(0.25, seed=3)
    assert (len(train), len(held)) == (15, 5)
    assert set(train.texts).isdisjoint(held.texts) and set(train.texts) | set(held.texts) == set(s.texts)
    assert [f"p{i}" for i in train.metadata["i"]] == list(train.texts)  # metadata stays aligned
    again = s.split(0.25, seed=3)
    assert again[0].texts == train.texts and again[1].texts == held.texts
    assert s.split(0.25, seed=4)[1].texts != held.texts
    assert len(s.split(3)[1]) == 3


@pytest.mark.parametrize("heldout", [0.01, 0, 5, 1.0, True, "0.1"])
def test_split_errors(heldout):
    with pytest.raises(ValueError, match="heldout"):
        PromptSet.from_list(["a", "b", "c", "d", "e"]).split(heldout)


# ------------------------------------------------------------------------------------ batches
def test_batches_visit_every_prompt_once_per_epoch_with_fixed_shapes(t2i_card, monkeypatch):
    texts = ["seven thick", "one", "two dim", "three left", "four", "five bright", "seven thick"]  # one duplicate
    s = PromptSet.from_list(texts, {"row": np.arange(7)})
    calls = []
    tokenize = jpp.tokenize  # patched where PromptSet looks it up (jaxpipe.prompts.sets)
    monkeypatch.setattr(jpp.sets, "tokenize", lambda card, t, **kw: calls.append(list(t)) or tokenize(card, t, **kw))
    it = s.batches(t2i_card, 3, seed=5)
    batches = [next(it) for _ in range(7)]  # 21 rows = 3 epochs of 7
    assert calls == [list(dict.fromkeys(texts))]  # each distinct prompt tokenized once, up front
    assert {(b.ids.shape, b.text.shape, b.metadata["row"].shape) for b in batches} == {((3, 8), (3, 64), (3,))}
    rows = np.concatenate([b.metadata["row"] for b in batches])
    for epoch in range(3):
        np.testing.assert_array_equal(rows[7 * epoch : 7 * epoch + 7], np.random.default_rng([5, epoch]).permutation(7))
    strings = sum((b.strings() for b in batches), [])
    assert strings == [texts[r] for r in rows]
    served = jpp.tokenize(t2i_card, texts)
    np.testing.assert_array_equal(np.concatenate([b.ids for b in batches]), served[rows])
    with pytest.raises(ValueError, match="prompts_per_step must be a positive int"):
        s.batches(t2i_card, 0)
    with pytest.raises(ValueError, match="unknown word"):
        PromptSet.from_list(["one", "seven purple"]).batches(t2i_card, 1)  # raises before the first batch


def test_a_jitted_step_compiles_once_for_every_batch(t2i_card):
    s = PromptSet.from_list(["seven thick", "one", "two dim left bright", "seven thick left bright moving up"])
    traces = []

    @jax.jit
    def step(p):
        traces.append(None)
        return jnp.sum(p.ids) + jnp.sum(p.text.astype(jnp.int32))

    it = s.batches(t2i_card, 2)
    for _ in range(4):
        step(next(it).repeat(2))
    assert len(traces) == 1
