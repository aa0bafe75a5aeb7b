"""The server's incremental detokenizer gives, chunk by chunk, exactly the text of decoding everything at once."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serve_helpers import FIXTURE
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from specops.models.target import load_tokenizer
from specops.serve.detok import Detokenizer

SAMPLES = ['{"query": "紅色跑鞋 3千以下", "brand": ["Nike"]}', "ünïcode 👟 shoes under 1.5k",
           "  two  spaces\nand a line"]


@pytest.fixture(scope="module")
def tok():
    """The fixture target's byte-level BPE tokenizer."""
    return load_tokenizer(FIXTURE / "target-merged", 10**9)


@pytest.fixture(scope="module")
def metaspace():
    """A sentencepiece-style tokenizer: a piece's leading space is dropped at the start of a text, so a piece's
    text depends on what precedes it."""
    vocab = {"<unk>": 0, "\u2581a": 1, "b": 2, "\u2581c": 3, "\u2581": 4, "d": 5}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    return PreTrainedTokenizerFast(tokenizer_object=tk, clean_up_tokenization_spaces=False)


def stream(tok, ids, cuts, stops=()):
    """Feed ``ids`` in chunks ending at ``cuts``; returns (the text streamed, the detokenizer)."""
    d = Detokenizer(tok, list(stops))
    out, start = [], 0
    for end in [*sorted(set(cuts)), len(ids)]:
        if end <= start and end != len(ids):
            continue
        out.append(d.add(ids[start:end], final=end == len(ids)))
        start = end
        if d.stopped:
            break
    return "".join(out), d


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 3071), max_size=60), cuts=st.lists(st.integers(0, 60), max_size=20))
def test_streamed_text_is_the_full_decode(tok, ids, cuts):
    """Any ids (including byte pieces that do not form whole characters, and special tokens) cut anywhere."""
    text, _ = stream(tok, ids, [c for c in cuts if c < len(ids)])
    assert text == tok.decode(ids, skip_special_tokens=True)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 5), max_size=20), cuts=st.lists(st.integers(0, 20), max_size=10))
def test_streamed_text_is_the_full_decode_where_a_piece_depends_on_the_one_before(metaspace, ids, cuts):
    text, _ = stream(metaspace, ids, [c for c in cuts if c < len(ids)])
    assert text == metaspace.decode(ids, skip_special_tokens=True)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_stop_strings_cut_the_text_before_the_first_match(tok, data):
    ids = tok.encode(data.draw(st.sampled_from(SAMPLES)), add_special_tokens=False)
    full = tok.decode(ids, skip_special_tokens=True)
    i = data.draw(st.integers(0, len(full) - 1))
    stop = full[i : i + data.draw(st.integers(1, 3))]
    cuts = data.draw(st.lists(st.integers(0, len(ids) - 1), max_size=10))
    text, d = stream(tok, ids, cuts, stops=["@never", stop])
    assert d.stopped and text == full[: full.find(stop)]


def test_text_that_could_begin_a_stop_string_or_ends_mid_character_waits(tok):
    d = Detokenizer(tok, ["END"])
    assert d.add(tok.encode("abc E", add_special_tokens=False)) == "abc"  # " E" may begin "END"
    assert d.add(tok.encode("xyz", add_special_tokens=False)) == " Ex"  # "yz" may still begin it
    shoe = tok.encode("👟", add_special_tokens=False)
    assert len(shoe) == 4  # one byte piece each
    assert [d.add([piece]) for piece in shoe] == ["", "", "", "y"]  # nothing moves until the character is whole
    assert d.add([], final=True) == "z👟"
