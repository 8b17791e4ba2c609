"""Stop tokens (an end-of-sequence id) end generation as Hugging Face's
eos_token_id does: generate(stop_tokens=[...]), by default the tokenizer's
eos_id; the id is the last of .tokens, not part of .text, and is
.stop_token. Before 2026-12-02 generation could stop only at a stop string,
and a control piece such as </s> decodes to "", so it ran past EOS."""
import struct

import pytest

from riftco_import import import_riftco

riftco = import_riftco()


def model(vocab_size=256, seed=1):
    return riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=vocab_size, context_length=32, model_width=16, heads=2, layers=2, feed_forward_width=32), seed=seed)


def test_a_stop_token_ends_generation_and_is_left_out_of_the_text():
    m = model()
    free = m.generate([72, 105], max_new_tokens=10, temperature=0)
    assert free.stop_token is None and len(free.tokens) == 10
    eos = free.tokens[3]
    first = free.tokens.index(eos)
    r = m.generate([72, 105], max_new_tokens=10, temperature=0, stop_tokens=[eos])
    assert r.tokens == free.tokens[:first + 1] and r.stop_token == eos
    assert r.text == bytes(free.tokens[:first]).decode("utf-8", "replace")
    assert f"at stop token {eos}" in r.message and f"stop_token={eos}" in repr(r)
    # No stop string ended it: stop_index is None (was -1, so stop[r.stop_index] picked the last string).
    assert r.stop_index is None and "stop_index" not in repr(r)
    with_strings = m.generate([72, 105], max_new_tokens=10, temperature=0, stop_tokens=[eos], stop=["\x00\x01"])
    assert with_strings.stop_token == eos and with_strings.stop_index is None
    for s in m.generate_samples([72, 105], num_samples=3, max_new_tokens=10, stop_tokens=[eos], seed=5):
        assert s.stop_token is None or s.tokens[-1] == eos == s.stop_token
    assert m.generate([72, 105], max_new_tokens=10, temperature=0, stop_tokens=[]).tokens == free.tokens


@pytest.mark.parametrize("bad, error, match", [
    ([256], riftco.ValueError, r"stop token 0 \(256\) is outside the vocabulary \[0, 256\)"),
    ([-1], riftco.ValueError, r"stop token 0 \(-1\) is not a token id"),
    ([2**70], riftco.ValueError, "is not a token id"),
    ([True], TypeError, "list of token ids"),
    ("a", TypeError, "list of token ids"),
    (5, TypeError, "list of token ids"),
])
def test_bad_stop_tokens_are_refused_naming_them(bad, error, match):
    with pytest.raises(error, match=match):
        model().generate([72], max_new_tokens=2, stop_tokens=bad)


def sentencepiece_with_eos(path):
    """A byte-fallback BPE model with a </s> control piece (id 1), written
    field by field: SentencePiece's eos_id is the </s> piece."""
    def varint(n):
        out = b""
        while True:
            b, n = n & 0x7F, n >> 7
            if n:
                out += bytes([b | 0x80])
            else:
                return out + bytes([b])

    def field(number, data):
        return varint((number << 3) | 2) + varint(len(data)) + data

    def piece(text, kind):
        return field(1, field(1, text.encode()) + struct.pack("<Bf", (2 << 3) | 5, 0.0) + varint(3 << 3) + varint(kind))

    body = piece("<unk>", 2) + piece("</s>", 3)
    body += b"".join(piece(f"<0x{b:02X}>", 6) for b in range(256)) + piece("a", 1) + piece("b", 1)
    body += field(2, varint(3 << 3) + varint(2) + varint(35 << 3) + varint(1))  # BPE, byte fallback
    body += field(3, field(1, b"identity"))
    path.write_bytes(body)


def test_the_tokenizers_eos_id_is_the_default_stop_token(tmp_path):
    sentencepiece_with_eos(tmp_path / "eos.model")
    t = riftco.Tokenizer.load(tmp_path / "eos.model")
    assert t.eos_id == 1 and t.vocab_size == 260
    assert riftco.Tokenizer().eos_id is None  # bytes
    m = model(vocab_size=260, seed=3)
    free = m.generate([5, 6], max_new_tokens=12, temperature=0, tokenizer=t, stop_tokens=[])
    if 1 not in free.tokens:  # make </s> the greedy choice after the prompt
        head = m.parameter("lm_head.weight").numpy().copy()
        head[1] = head[free.tokens[0]] * 2.0
        m.parameter("lm_head.weight").set_value(head)
        free = m.generate([5, 6], max_new_tokens=12, temperature=0, tokenizer=t, stop_tokens=[])
    assert 1 in free.tokens
    r = m.generate([5, 6], max_new_tokens=12, temperature=0, tokenizer=t)
    assert r.stop_token == 1 and r.tokens == free.tokens[:free.tokens.index(1) + 1]
