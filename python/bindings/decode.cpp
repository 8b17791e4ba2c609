// Incremental decoding, generation and the byte tokenizer (decode.hpp, data.hpp).
#include <limits>
#include <optional>

#include "common.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/decode.hpp"

namespace riftco_python {
namespace {

struct Generated {
  std::vector<std::int32_t> tokens;
  std::optional<std::string> text;  // None: token ids in and out, no tokenizer to decode them with
  bool reached_context = false;
  std::string message;
  std::optional<std::int64_t> stop_index;
  std::optional<std::int32_t> stop_token;
};

nb::str decode_text(const std::vector<std::int32_t>& ids) {
  const std::string bytes = rt::ByteTokenizer{}.decode(ids);
  nb::bytes raw(bytes.data(), bytes.size());
  return nb::str(raw.attr("decode")("utf-8", "replace"));
}

nb::str text_of_bytes(const std::string& bytes) {
  nb::bytes raw(bytes.data(), bytes.size());
  return nb::str(raw.attr("decode")("utf-8", "replace"));
}

std::string repr_of(const Generated& g) {
  // The whole text (a NUL is common in a small model's output; c_str() cut it there).
  const std::string text =
      g.text ? nb::cast<std::string>(nb::repr(nb::str(g.text->data(), g.text->size()))) : "None";
  return "GenerationResult(text=" + text + ", tokens=" + std::to_string(g.tokens.size()) +
         ", reached_context=" + (g.reached_context ? "True" : "False") +
         (g.stop_index ? ", stop_index=" + std::to_string(*g.stop_index) : std::string()) +
         (g.stop_token ? ", stop_token=" + std::to_string(*g.stop_token) : std::string()) + ")";
}

using OptionalTokenizer = std::optional<rt::Tokenizer>;

Generated to_python(const rt::GenerationResult& r, const OptionalTokenizer& tokenizer, bool with_text) {
  Generated g{r.tokens, std::nullopt, r.reached_context, r.message, std::nullopt, std::nullopt};
  if (r.stop_token >= 0) g.stop_token = r.stop_token;
  if (!with_text) return g;
  if (r.stop_index >= 0 || r.stop_token >= 0) {
    if (r.stop_index >= 0) g.stop_index = r.stop_index;  // a stop token: None, not -1 (stop[-1] is a string)
    g.text = nb::cast<std::string>(text_of_bytes(r.text));  // cut before the stop string or token
  } else if (tokenizer && !tokenizer->is_bytes()) {
    g.text = nb::cast<std::string>(text_of_bytes(tokenizer->decode(r.tokens)));
  } else {
    g.text = nb::cast<std::string>(decode_text(r.tokens));
  }
  return g;
}

/// generate()'s keyword arguments as GenerationOptions (stop: a str or a list of str).
rt::GenerationOptions options_of(const IntArg<std::int64_t>& max_new_tokens, RealArg<float> temperature, const IntArg<std::int64_t>& top_k,
                                 const IntArg<std::uint64_t>& seed, RealArg<float> top_p, RealArg<float> repetition_penalty, nb::handle stop,
                                 const IntArg<std::int64_t>& num_samples, nb::handle stop_tokens,
                                 const std::optional<rt::Tokenizer>& tokenizer) {
  rt::GenerationOptions o;
  o.max_new_tokens = max_new_tokens.get("[generate] max_new_tokens");
  o.temperature = temperature.value;
  o.top_k = top_k.get("[generate] top_k");
  o.seed = seed.get("[generate] seed");
  o.top_p = top_p.value;
  o.repetition_penalty = repetition_penalty.value;
  o.num_samples = num_samples.get("[generate_samples] num_samples");
  if (nb::isinstance<nb::str>(stop)) {
    o.stop.push_back(utf8_of(stop, "[generate] the stop string"));
  } else if (!stop.is_none()) {
    if (!nb::isinstance<nb::iterable>(stop)) throw rt::ValueError("[generate] stop must be a str or a list of str");
    for (nb::handle s : nb::borrow<nb::iterable>(stop)) {
      if (!nb::isinstance<nb::str>(s)) throw rt::ValueError("[generate] stop must be a str or a list of str");
      o.stop.push_back(utf8_of(s, "[generate] stop string " + std::to_string(o.stop.size())));
    }
  }
  if (stop_tokens.is_none()) {  // the default: the tokenizer's end-of-sequence id, as Hugging Face's eos_token_id
    if (tokenizer && tokenizer->eos_id() >= 0) o.stop_tokens.push_back(tokenizer->eos_id());
  } else {
    const char* expected = "[generate] stop_tokens must be a list of token ids (ints; [] for none)";
    if (!nb::isinstance<nb::iterable>(stop_tokens) || nb::isinstance<nb::str>(stop_tokens)) {
      throw nb::type_error(expected);
    }
    for (nb::handle id : nb::borrow<nb::iterable>(stop_tokens)) {
      if (!nb::isinstance<nb::int_>(id) || nb::isinstance<nb::bool_>(id)) throw nb::type_error(expected);
      int overflow = 0;
      const long long value = PyLong_AsLongLongAndOverflow(id.ptr(), &overflow);
      if (overflow != 0 || value < 0 || value > std::numeric_limits<std::int32_t>::max()) {
        throw rt::ValueError("[generate] stop token " + std::to_string(o.stop_tokens.size()) + " (" +
                             nb::cast<std::string>(nb::repr(id)) + ") is not a token id");
      }
      o.stop_tokens.push_back(static_cast<std::int32_t>(value));
    }
  }
  o.validate();
  return o;
}

/// Whether generate() works with text at all, and so needs a tokenizer of
/// the model's vocabulary. Token ids in, with tokenizer=None and no stop
/// strings, is ids out whatever the vocabulary (as C++ generate() and C
/// rt_generate): the bytes tokenizer is only assumed where text is encoded
/// or decoded, so a model whose vocabulary is not 256 gets .text None there.
bool needs_text(const rt::DecoderOnlyTransformer& model, nb::handle prompt, const OptionalTokenizer& tokenizer,
                const rt::GenerationOptions& options) {
  return tokenizer || nb::isinstance<nb::str>(prompt) || !options.stop.empty() ||
         model.dimensions().vocab_size == rt::ByteTokenizer{}.vocab_size();
}

/// Before any work, where text is encoded or decoded: the tokenizer (None:
/// bytes, vocabulary 256) must have the model's vocabulary, as evaluate()
/// and tokenizer_for_model require, or the model would sample ids it cannot
/// decode (or be given ids it has no embedding for) partway through.
void check_tokenizer(const rt::DecoderOnlyTransformer& model, nb::handle prompt, const OptionalTokenizer& tokenizer) {
  const std::int64_t vocab = tokenizer ? tokenizer->vocab_size() : rt::ByteTokenizer{}.vocab_size();
  if (vocab != model.dimensions().vocab_size) {
    std::string which;
    if (!tokenizer) {
      which = nb::isinstance<nb::str>(prompt) ? " (tokenizer=None: bytes, for the str prompt)"
                                              : " (tokenizer=None: bytes, for the stop strings)";
    }
    throw rt::ValueError("[generate] the tokenizer's vocabulary is " + std::to_string(vocab) + which +
                         " but the model's is " + std::to_string(model.dimensions().vocab_size) +
                         " (give the tokenizer the model was trained with: Tokenizer.for_model)");
  }
}

std::vector<std::int32_t> prompt_ids(nb::handle prompt, const OptionalTokenizer& tokenizer) {
  if (!nb::isinstance<nb::str>(prompt)) {
    TokenArray tokens = tokens_from_python(prompt, "generate");
    if (tokens.ndim != 1) {  // (B, T) would be read as one flattened sequence
      throw rt::ValueError("[generate] prompt must be a str or a 1-D sequence of token ids, got " +
                           std::to_string(tokens.ndim) + " dimensions (generate_samples for several continuations)");
    }
    return std::move(tokens.ids);
  }
  const std::string text = utf8_of(prompt, "[generate] the prompt");
  return tokenizer ? tokenizer->encode(text) : rt::ByteTokenizer{}.encode(text);
}

/// A subword tokenizer decodes the new tokens for stop strings and .text.
void use_tokenizer(rt::GenerationOptions& o, const OptionalTokenizer& tokenizer) {
  if (!tokenizer || tokenizer->is_bytes()) return;
  o.detokenize = [t = *tokenizer](std::span<const std::int32_t> ids) { return t.decode(ids); };
}

}  // namespace

void init_decode(nb::module_& m) {
  nb::class_<rt::ByteTokenizer>(m, "ByteTokenizer", "One token per UTF-8 byte (ids 0..255).")
      .def(nb::init<>())
      .def("encode", [](const rt::ByteTokenizer& t, nb::str text) { return t.encode(utf8_of(text, "[encode] text")); },
           "text"_a)
      .def("decode", [](const rt::ByteTokenizer&, nb::handle ids) {
        return decode_text(tokens_from_python(ids, "decode").ids);
      }, "ids"_a, "Text of the bytes (invalid UTF-8 becomes U+FFFD).")
      .def_prop_ro("vocab_size", &rt::ByteTokenizer::vocab_size);

  nb::class_<rt::DecodeSession>(m, "DecodeSession",
                                "Incremental decoding with a K/V cache; builds no graph and never checkpoints.\n"
                                "Holds the model's state: valid after the model object is gone.")
      .def(nb::init<const rt::DecoderOnlyTransformer&>(), "model"_a)
      .def(
          "decode_token",
          [](rt::DecodeSession& s, const IntArg<std::int32_t>& token_arg) {
            const std::int32_t token = token_arg.get("[decode_token] token");
            rt::Tensor logits;
            {
              ComputeWithoutGil release;
              logits = s.decode_token(token);
            }
            return to_numpy(logits);
          },
          "token"_a, "Appends `token` and returns the next-token logits (V,) as a numpy array.")
      .def_prop_ro("position", &rt::DecodeSession::position)
      .def_prop_ro("capacity", &rt::DecodeSession::capacity)
      .def("reset", &rt::DecodeSession::reset, "Empties the cache and accepts the model's current values.");

  nb::class_<Generated>(m, "GenerationResult", "generate()'s answer: the new tokens, their text, why it stopped.")
      .def_ro("tokens", &Generated::tokens)
      .def_ro("text", &Generated::text,
              "the new tokens' text (None: a prompt of token ids, tokenizer=None, a model whose vocabulary is not "
              "256)")
      .def_ro("reached_context", &Generated::reached_context)
      .def_ro("message", &Generated::message)
      .def_ro("stop_index", &Generated::stop_index, "which stop string ended it (None: none did)")
      .def_ro("stop_token", &Generated::stop_token, "the stop token (end-of-sequence id) that ended it (None: none did)")
      .def("__str__", [](const Generated& g) { return g.text ? *g.text : repr_of(g); })
      .def("__repr__", &repr_of);

  const rt::GenerationOptions d{};
  nb::handle model_type = nb::type<rt::DecoderOnlyTransformer>();
  model_type.attr("generate") = nb::cpp_function(
      [](const rt::DecoderOnlyTransformer& model, nb::handle prompt, const IntArg<std::int64_t>& max_new_tokens,
         RealArg<float> temperature, const IntArg<std::int64_t>& top_k, const IntArg<std::uint64_t>& seed, RealArg<float> top_p,
         RealArg<float> repetition_penalty, nb::handle stop, const OptionalTokenizer& tokenizer, nb::handle stop_tokens) {
        rt::GenerationOptions options = options_of(max_new_tokens, temperature, top_k, seed, top_p,
                                                   repetition_penalty, stop, IntArg<std::int64_t>(1), stop_tokens, tokenizer);
        const bool with_text = needs_text(model, prompt, tokenizer, options);
        if (with_text) check_tokenizer(model, prompt, tokenizer);
        const std::vector<std::int32_t> ids = prompt_ids(prompt, tokenizer);
        use_tokenizer(options, tokenizer);
        rt::GenerationResult r;
        SignalCheck signals;
        options.interrupt = signals.function();
        try {
          ComputeWithoutGil release;
          r = rt::generate(model, ids, options);
        } catch (const SignalCheck::Interrupted&) {
        }
        signals.rethrow_if_pending();  // Ctrl-C: KeyboardInterrupt
        return to_python(r, tokenizer, with_text);
      },
      nb::scope(model_type), nb::is_method(), nb::name("generate"), "prompt"_a, nb::kw_only(), "max_new_tokens"_a = d.max_new_tokens,
      "temperature"_a = d.temperature, "top_k"_a = d.top_k, "seed"_a = d.seed, "top_p"_a = d.top_p,
      "repetition_penalty"_a = d.repetition_penalty, "stop"_a = nb::none(), "tokenizer"_a = nb::none(),
      "stop_tokens"_a = nb::none(),
      "Continues `prompt` (text, encoded as bytes or with `tokenizer`, or token ids). tokenizer: the\n"
      "model's Tokenizer (None: bytes) for the prompt, .text and stop strings (token ids with tokenizer=None on a\n"
      "model whose vocabulary is not 256: ids out, .text None). temperature 0: greedy. top_p in (0, 1]\n"
      "(1: off), repetition_penalty > 0 (1: off), stop: a str or list of str ending the text (excluded\n"
      "from .text), stop_tokens: token ids ending it, as Hugging Face's eos_token_id (None: the tokenizer's\n"
      "eos_id if it has one; []: none; the id ends .tokens, not .text, and is .stop_token). Releases the GIL;\n"
      "Ctrl-C stops it between tokens (KeyboardInterrupt).");
  model_type.attr("generate_samples") = nb::cpp_function(
      [](const rt::DecoderOnlyTransformer& model, nb::handle prompt, const IntArg<std::int64_t>& num_samples,
         const IntArg<std::int64_t>& max_new_tokens, RealArg<float> temperature, const IntArg<std::int64_t>& top_k, const IntArg<std::uint64_t>& seed,
         RealArg<float> top_p, RealArg<float> repetition_penalty, nb::handle stop, const OptionalTokenizer& tokenizer,
         nb::handle stop_tokens) {
        rt::GenerationOptions options = options_of(max_new_tokens, temperature, top_k, seed, top_p,
                                                   repetition_penalty, stop, num_samples, stop_tokens, tokenizer);
        const bool with_text = needs_text(model, prompt, tokenizer, options);
        if (with_text) check_tokenizer(model, prompt, tokenizer);
        const std::vector<std::int32_t> ids = prompt_ids(prompt, tokenizer);
        use_tokenizer(options, tokenizer);
        std::vector<rt::GenerationResult> r;
        SignalCheck signals;
        options.interrupt = signals.function();
        try {
          ComputeWithoutGil release;
          r = rt::generate_samples(model, ids, options);
        } catch (const SignalCheck::Interrupted&) {
        }
        signals.rethrow_if_pending();  // Ctrl-C: KeyboardInterrupt
        std::vector<Generated> out;
        for (const rt::GenerationResult& one : r) out.push_back(to_python(one, tokenizer, with_text));
        return out;
      },
      nb::scope(model_type), nb::is_method(), nb::name("generate_samples"), "prompt"_a, nb::kw_only(),
      "num_samples"_a, "max_new_tokens"_a = d.max_new_tokens, "temperature"_a = d.temperature, "top_k"_a = d.top_k,
      "seed"_a = d.seed, "top_p"_a = d.top_p, "repetition_penalty"_a = d.repetition_penalty, "stop"_a = nb::none(),
      "tokenizer"_a = nb::none(), "stop_tokens"_a = nb::none(),
      "num_samples independent continuations (a list of GenerationResult); sample i uses the seed\n"
      "seed + i * 0x9E3779B97F4A7C15 (mod 2**64), so sample 0 is generate(seed=seed). Releases the GIL;\n"
      "Ctrl-C stops it between tokens (KeyboardInterrupt).");
}

}  // namespace riftco_python
