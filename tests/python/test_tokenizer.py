"""Subword tokenizers and evaluation from Python and from the tools:
train_tokenizer, Tokenizer, evaluate, pretraining with a tokenizer,
rt-train tokenizer, rt-generate / rt-eval refusing the wrong tokenizer."""
import json
import math
import pathlib
import subprocess

import pytest

from riftco_import import import_riftco

riftco = import_riftco()
TEXT = "".join(f"the quick brown fox {i % 7} jumps over the lazy dog; café {i % 5}.\n" for i in range(400))
TINY = ["--context-length", "32", "--model-width", "16", "--heads", "2", "--layers", "1",
        "--feed-forward-width", "32", "--batch", "2", "--sequence-length", "16", "--eval-batches", "1", "--quiet"]


def run(tool, *args):
    return subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_train_tokenizer_round_trips_and_is_deterministic(tmp_path):
    a = riftco.train_tokenizer(TEXT, tmp_path / "a.model", vocab_size=300)
    b = riftco.train_tokenizer(TEXT, tmp_path / "b.model", vocab_size=300, model_type="bpe")
    assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()
    assert a.checksum == b.checksum and len(a.checksum) == 16 and a.vocab_size == 300 and not a.is_bytes
    t = riftco.Tokenizer.load(tmp_path / "a.model")
    ids = t.encode(TEXT)
    assert len(ids) < len(TEXT.encode()) and t.decode(ids) == TEXT
    assert t.byte_length(ids) == len(TEXT.encode())
    assert riftco.Tokenizer().is_bytes and riftco.Tokenizer().vocab_size == 256
    with pytest.raises(riftco.ValueError, match="wordpiece"):
        riftco.train_tokenizer(TEXT, tmp_path / "c.model", model_type="wordpiece")
    with pytest.raises(riftco.ValueError, match="vocab_size"):
        riftco.train_tokenizer(TEXT, tmp_path / "c.model", vocab_size=5)
    (tmp_path / "bad.model").write_bytes(b"\x0a\x03abc garbage")
    with pytest.raises(riftco.DataError, match="bad.model"):
        riftco.Tokenizer.load(tmp_path / "bad.model")
    with pytest.raises(riftco.DataError):
        riftco.Tokenizer.load(tmp_path / "missing.model")


def test_evaluate_bits_per_byte(tmp_path):
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=256, context_length=16, model_width=16, heads=2, layers=1, feed_forward_width=24))
    r = riftco.evaluate(model, TEXT[:300], batch=4)
    n = len(TEXT[:300].encode()) - 1
    assert r.tokens == n and r.bytes == n
    assert r.bits_per_byte == r.loss / math.log(2)
    assert r.perplexity == pytest.approx(math.exp(r.loss))
    tok = riftco.train_tokenizer(TEXT, tmp_path / "t.model", vocab_size=300)
    with pytest.raises(riftco.ValueError, match="vocabulary"):
        riftco.evaluate(model, TEXT[:300], tok)


def test_pretraining_with_a_tokenizer_and_the_tools(tmp_path, build_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    train, generate, evaluate = build_dir / "rt-train", build_dir / "rt-generate", build_dir / "rt-eval"
    if not evaluate.exists():
        pytest.skip("rt-eval not built")
    out = run(train, "tokenizer", "--data", corpus, "--vocab-size", 300, "--output", tmp_path / "tok.model")
    assert out.returncode == 0, out.stderr
    assert "300 pieces" in out.stdout
    assert run(train, "tokenizer", "--data", corpus, "--vocab-size", 310, "--output", tmp_path / "other.model",
               "--validation-fraction", 0.1).returncode == 0
    refused = run(train, "tokenizer", "--data", corpus, "--vocab-size", 5000, "--model-type", "unigram",
                  "--output", tmp_path / "x.model")
    assert refused.returncode == 1 and "too small for vocab_size 5000: SentencePiece can make at most" in refused.stderr
    bad = run(train, "tokenizer", "--data", corpus, "--model-type", "word", "--output", tmp_path / "x.model")
    assert bad.returncode == 2 and "model-type" in bad.stderr

    out = run(train, "pretrain", *TINY, "--data", corpus, "--steps", 2, "--tokenizer", tmp_path / "tok.model",
              "--output", tmp_path / "run")
    assert out.returncode == 0, out.stderr
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["config"]["dimensions"]["vocab_size"] == 300
    assert meta["config"]["tokenizer"] == str(tmp_path / "tok.model")
    model = tmp_path / "run" / "model.safetensors"

    # rt-generate: the recorded tokenizer by default; another one refused naming both checksums.
    out = run(generate, "--model", model, "--prompt", "the ", "--max-new-tokens", 5)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("the ")
    wrong = run(generate, "--model", model, "--tokenizer", tmp_path / "other.model", "--prompt", "the ")
    assert wrong.returncode == 2 and "checksum" in wrong.stderr, wrong.stderr
    # The Python side agrees: the model's tokenizer and a refusal of another.
    assert riftco.Tokenizer.for_model(model).checksum == riftco.Tokenizer.load(tmp_path / "tok.model").checksum
    with pytest.raises(riftco.ValueError, match="checksum"):
        riftco.Tokenizer.for_model(model, tmp_path / "other.model")
    # Python generation with the model's tokenizer: the same text rt-generate prints.
    tok = riftco.Tokenizer.for_model(model)
    g = riftco.load_model(model).generate("the ", max_new_tokens=5, temperature=0.8, top_k=40, seed=0, tokenizer=tok)
    assert len(g.tokens) == 5 and g.text == tok.decode(g.tokens)
    cli = run(generate, "--model", model, "--prompt", "the ", "--max-new-tokens", 5, "--temperature", 0.8,
              "--top-k", 40, "--seed", 0)
    assert cli.stdout == "the " + g.text + "\n"

    # rt-eval: text and JSON output; the same numbers as riftco.evaluate.
    out = run(evaluate, "--model", model, "--data", corpus, "--split", "validation", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["bytes"] > result["tokens"] > 0
    held_out = TEXT.encode()[len(TEXT.encode()) - len(TEXT.encode()) // 10:].decode()
    py = riftco.evaluate(riftco.load_model(model), held_out, riftco.Tokenizer.load(tmp_path / "tok.model"))
    assert py.tokens == result["tokens"] and py.bits_per_byte == pytest.approx(result["bits_per_byte"], rel=1e-6)
    out = run(evaluate, "--model", model, "--data", corpus)
    assert out.returncode == 0 and "bits per byte" in out.stdout
    wrong = run(evaluate, "--model", model, "--data", corpus, "--tokenizer", tmp_path / "other.model")
    assert wrong.returncode == 2 and "checksum" in wrong.stderr
    (tmp_path / "tok.model").rename(tmp_path / "moved.model")
    missing = run(evaluate, "--model", model, "--data", corpus)
    assert missing.returncode == 2 and "not found" in missing.stderr, missing.stderr
    assert run(evaluate, "--model", model, "--data", corpus, "--tokenizer", tmp_path / "moved.model").returncode == 0


@pytest.mark.parametrize("model_vocab", [512, 256])
def test_generate_refuses_a_tokenizer_of_another_vocabulary_before_generating(tmp_path, model_vocab):
    # Was: a 512-token model sampled ids the 300-token tokenizer cannot decode
    # and failed partway (or a 256-token model got prompt ids it has no row for).
    tok = riftco.train_tokenizer(TEXT, tmp_path / "t.model", vocab_size=300)
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=model_vocab, context_length=32, model_width=16, heads=2, layers=1, feed_forward_width=32), seed=3)
    needle = f"tokenizer's vocabulary is 300 but the model's is {model_vocab}"
    with pytest.raises(ValueError, match=needle):
        model.generate("the quick", max_new_tokens=20, tokenizer=tok)
    with pytest.raises(ValueError, match=needle):
        model.generate_samples("the", num_samples=2, max_new_tokens=20, tokenizer=tok, stop="zz")


def test_split_text_is_the_runs_split_on_every_surface():
    text = "héllo wörld, " * 100
    train = riftco.split_text(text, "train", 0.25)
    validation = riftco.split_text(text, "validation", 0.25)
    assert train + validation == text and riftco.split_text(text, "all") == text
    assert abs(len(validation.encode()) - len(text.encode()) // 4) <= 1  # a character boundary
    assert riftco.split_text(text, "validation", 0.0) == ""
    with pytest.raises(riftco.ValueError, match="unknown split 'test'"):
        riftco.split_text(text, "test")
    with pytest.raises(riftco.ValueError):
        riftco.split_text(text, "train", 1.0)
