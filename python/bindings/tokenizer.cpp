// Tokenizers and evaluation (tokenizer.hpp, evaluation.hpp): Tokenizer,
// train_tokenizer, evaluate.
#include "common.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/evaluation.hpp"
#include "riftco_transformer/pipelines.hpp"
#include "riftco_transformer/tokenizer.hpp"

namespace riftco_python {
namespace {

nb::str text_of(const std::string& bytes) {
  nb::bytes raw(bytes.data(), bytes.size());
  return nb::str(raw.attr("decode")("utf-8", "replace"));
}

}  // namespace

void init_tokenizer(nb::module_& m) {
  nb::class_<rt::Tokenizer>(m, "Tokenizer",
                            "The byte tokenizer (Tokenizer()) or a SentencePiece model (Tokenizer.load(path)).")
      .def(nb::init<>(), "The byte tokenizer (ids 0..255).")
      .def_static("load", &rt::Tokenizer::load, "path"_a,
                  "A SentencePiece model file (from train_tokenizer / `rt-train tokenizer`); DataError when it is "
                  "missing, corrupt or has no byte-fallback pieces.")
      .def_static(
          "for_model",
          [](const std::filesystem::path& model, const std::optional<std::filesystem::path>& tokenizer,
             bool use_recorded) {
            return rt::tokenizer_for_model(model, tokenizer.value_or(std::filesystem::path()), use_recorded);
          },
          "model"_a, "tokenizer"_a = nb::none(), "use_recorded"_a = true,
                  "The tokenizer a model-state file records (ValueError naming both checksums for another one).")
      .def("encode", [](const rt::Tokenizer& t, nb::str text) { return t.encode(utf8_of(text, "[encode] text")); },
           "text"_a)
      .def("decode", [](const rt::Tokenizer& t, nb::handle ids) {
        return text_of(t.decode(tokens_from_python(ids, "decode").ids));
      }, "ids"_a, "Text of the ids (invalid UTF-8 becomes U+FFFD).")
      .def("byte_length", [](const rt::Tokenizer& t, nb::handle ids) {
        return t.byte_length(tokens_from_python(ids, "byte_length").ids);
      }, "ids"_a, "Bytes of text the ids stand for (for bits per byte).")
      .def_prop_ro("vocab_size", &rt::Tokenizer::vocab_size)
      .def_prop_ro("is_bytes", &rt::Tokenizer::is_bytes)
      .def_prop_ro("eos_id", [](const rt::Tokenizer& t) -> std::optional<std::int32_t> {
        if (t.eos_id() < 0) return std::nullopt;
        return t.eos_id();
      }, "the end-of-sequence id generate() stops at by default (None: the tokenizer has none)")
      .def_prop_ro("checksum", &rt::Tokenizer::checksum, "16 hex digits of the model file's hash; '' for bytes")
      .def_prop_ro("path", [](const rt::Tokenizer& t) -> std::optional<std::filesystem::path> {
        if (t.is_bytes()) return std::nullopt;
        return t.path();
      })
      .def("__repr__", [](const rt::Tokenizer& t) { return str_of_bytes("Tokenizer(" + t.description() + ")"); });

  m.def(
      "train_tokenizer",
      [](nb::str text_object, const std::filesystem::path& output, const IntArg<std::int64_t>& vocab_size, nb::str model_type) {
        const std::string text = utf8_of(text_object, "[train_tokenizer] text");
        rt::TokenizerTrainingOptions o;
        o.vocab_size = vocab_size.get("[train_tokenizer] vocab_size");
        o.model_type = rt::parse_tokenizer_model_type(choice_of(model_type, "[train_tokenizer] model_type"),
                                                      "train_tokenizer");
        nb::gil_scoped_release release;
        return rt::train_tokenizer(text, o, output);
      },
      "text"_a, "output"_a, "vocab_size"_a = 2048, "model_type"_a = "bpe",
      "Trains a SentencePiece tokenizer ('bpe' or 'unigram', byte fallback, deterministic) on `text`, writes it "
      "atomically to `output` and returns it.");

  nb::class_<rt::EvaluationResult>(m, "EvaluationResult", "evaluate()'s answer.")
      .def_ro("tokens", &rt::EvaluationResult::tokens)
      .def_ro("bytes", &rt::EvaluationResult::bytes)
      .def_ro("loss", &rt::EvaluationResult::loss, "mean cross-entropy per scored token, nats")
      .def_ro("perplexity", &rt::EvaluationResult::perplexity)
      .def_ro("bits_per_byte", &rt::EvaluationResult::bits_per_byte)
      .def("__repr__", [](const rt::EvaluationResult& r) {
        return "EvaluationResult(loss=" + std::to_string(r.loss) + ", perplexity=" + std::to_string(r.perplexity) +
               ", bits_per_byte=" + std::to_string(r.bits_per_byte) + ", tokens=" + std::to_string(r.tokens) +
               ", bytes=" + std::to_string(r.bytes) + ")";
      });

  m.def(
      "evaluate",
      [](rt::DecoderOnlyTransformer& model, nb::str text_object, std::optional<rt::Tokenizer> tokenizer,
         const IntArg<std::int64_t>& batch, const IntArg<std::int64_t>& sequence_length) {
        const std::string text = utf8_of(text_object, "[evaluate] text");
        rt::EvaluationOptions o;
        o.batch = batch.get("[evaluate] batch");
        o.sequence_length = sequence_length.get("[evaluate] sequence_length");
        const rt::Tokenizer t = tokenizer.value_or(rt::Tokenizer{});
        SignalCheck signals;
        o.interrupt = signals.function();
        rt::EvaluationResult result;
        try {
          ComputeWithoutGil release;
          result = rt::evaluate(model, text, t, o);
        } catch (const SignalCheck::Interrupted&) {
        }
        signals.rethrow_if_pending();  // Ctrl-C: KeyboardInterrupt
        return result;
      },
      "model"_a, "text"_a, "tokenizer"_a = nb::none(), "batch"_a = 8, "sequence_length"_a = 0,
      "Loss, perplexity and bits per byte of `model` on `text` (non-overlapping windows of sequence_length, 0: "
      "the context length). tokenizer None: bytes. Releases the GIL; Ctrl-C stops it between batches\n"
      "(KeyboardInterrupt). Dropout is off for this call's forwards only: model.training and other threads'\n"
      "forwards are untouched.");
  m.def(
      "split_text",
      [](nb::str text_object, nb::str split_object, RealArg<double> validation_fraction_arg) {
        const double validation_fraction = validation_fraction_arg.value;
        const std::string text = utf8_of(text_object, "[split_text] text");
        const std::string split = choice_of(split_object, "[split_text] split");
        if (split == "all") return str_of_bytes(text);
        if (split != "train" && split != "validation") {
          throw rt::ValueError("[split_text] unknown split '" + split + "' (expected all, train or validation)");
        }
        return str_of_bytes(rt::split_text(text, split == "train" ? rt::Split::Train : rt::Split::Validation,
                                           validation_fraction));
      },
      "text"_a, "split"_a, "validation_fraction"_a = 0.1,
      "The part of `text` a pretraining run trains on ('train') or holds out ('validation'; the last\n"
      "validation_fraction of its bytes, the cut moved to a character boundary), or all of it: what\n"
      "`rt-train tokenizer --validation-fraction` trains on and `rt-eval --split` scores.");
}

}  // namespace riftco_python
