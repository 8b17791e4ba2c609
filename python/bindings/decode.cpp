// Incremental decoding, generation and the byte tokenizer (decode.hpp, data.hpp).
#include "common.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/decode.hpp"

namespace riftco_python {
namespace {

struct Generated {
  std::vector<std::int32_t> tokens;
  std::string text;
  bool reached_context = false;
  std::string message;
};

nb::str decode_text(const std::vector<std::int32_t>& ids) {
  const std::string bytes = rt::ByteTokenizer{}.decode(ids);
  nb::bytes raw(bytes.data(), bytes.size());
  return nb::str(raw.attr("decode")("utf-8", "replace"));
}

}  // namespace

void init_decode(nb::module_& m) {
  nb::class_<rt::ByteTokenizer>(m, "ByteTokenizer", "One token per UTF-8 byte (ids 0..255).")
      .def(nb::init<>())
      .def("encode", [](const rt::ByteTokenizer& t, const std::string& text) { return t.encode(text); }, "text"_a)
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
          [](rt::DecodeSession& s, std::int32_t token) {
            rt::Tensor logits;
            {
              nb::gil_scoped_release release;
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
      .def_ro("text", &Generated::text)
      .def_ro("reached_context", &Generated::reached_context)
      .def_ro("message", &Generated::message)
      .def("__str__", [](const Generated& g) { return g.text; })
      .def("__repr__", [](const Generated& g) {
        return "GenerationResult(text=" + nb::cast<std::string>(nb::repr(nb::str(g.text.c_str()))) + ", tokens=" +
               std::to_string(g.tokens.size()) + ", reached_context=" + (g.reached_context ? "True" : "False") + ")";
      });

  const rt::GenerationOptions d{};
  nb::handle model_type = nb::type<rt::DecoderOnlyTransformer>();
  model_type.attr("generate") = nb::cpp_function(
      [](const rt::DecoderOnlyTransformer& model, nb::handle prompt, std::int64_t max_new_tokens, float temperature,
         std::int64_t top_k, std::uint64_t seed) {
        std::vector<std::int32_t> ids = nb::isinstance<nb::str>(prompt)
                                            ? rt::ByteTokenizer{}.encode(nb::cast<std::string>(prompt))
                                            : tokens_from_python(prompt, "generate").ids;
        const rt::GenerationOptions options{max_new_tokens, temperature, top_k, seed};
        rt::GenerationResult r;
        {
          nb::gil_scoped_release release;
          r = rt::generate(model, ids, options);
        }
        Generated g{r.tokens, "", r.reached_context, r.message};
        g.text = nb::cast<std::string>(decode_text(r.tokens));
        return g;
      },
      nb::scope(model_type), nb::is_method(), nb::name("generate"), "prompt"_a, nb::kw_only(), "max_new_tokens"_a = d.max_new_tokens,
      "temperature"_a = d.temperature, "top_k"_a = d.top_k, "seed"_a = d.seed,
      "Continues `prompt` (text, encoded as bytes, or token ids). temperature 0: greedy. Releases the GIL.");
}

}  // namespace riftco_python
