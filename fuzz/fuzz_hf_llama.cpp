// libFuzzer: Hugging Face Llama checkpoint directories (load_hf_llama). The
// first input byte chooses which file the rest of the input replaces in an
// otherwise valid checkpoint of the seeds' tiny model: 0 config.json, 1
// model.safetensors (F32/F16/BF16 reader), 2 model.safetensors.index.json
// (with the weights moved to a shard). Only ModelStateError may escape.
#include <cstdio>
#include <filesystem>

#include "fuzz_common.hpp"
#include "riftco_transformer/hf_llama.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

/// A per-process path (rt_fuzz::input_path keeps one name per process).
fs::path own_path(const char* name) {
  return fs::temp_directory_path() / ("riftco_fuzz_" + std::to_string(::getpid()) + "_" + name);
}

/// A valid checkpoint made once: {dir}/single (one file) and {dir}/sharded.
const fs::path& valid_checkpoint() {
  static const fs::path dir = [] {
    const fs::path root = own_path("hf_valid");
    const TransformerDimensions d{256, 32, 16, 2, 2, 32};  // the seeds' model (make_corpus.sh)
    Random random(0);
    DecoderOnlyTransformer model(d, random);
    save_hf_llama(model, root / "single");
    fs::create_directories(root / "sharded");
    fs::copy_file(root / "single" / "config.json", root / "sharded" / "config.json", fs::copy_options::overwrite_existing);
    fs::copy_file(root / "single" / "model.safetensors", root / "sharded" / "shard-1.safetensors",
                  fs::copy_options::overwrite_existing);
    return root;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const fs::path& root = valid_checkpoint();
  const int mode = data[0] % 3;
  static const fs::path work = own_path("hf_work");
  std::error_code ec;
  fs::remove_all(work, ec);
  // overwrite_existing: whatever a failed remove_all left is replaced, not an
  // error (the harness aborted once, after ~60,000 inputs, on this copy).
  fs::copy(root / (mode == 2 ? "sharded" : "single"), work,
           fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
  if (ec) {  // the harness itself failed: say why
    std::fprintf(stderr, "fuzz_hf_llama harness: copying the valid checkpoint to %s failed: %s\n",
                 work.c_str(), ec.message().c_str());
    std::abort();
  }
  const char* name = mode == 0 ? "config.json" : mode == 1 ? "model.safetensors" : "model.safetensors.index.json";
  std::ofstream out(work / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  out.close();
  if (!out) std::abort();
  try {
    load_hf_llama(work);
  } catch (const ModelStateError&) {
  }
  return 0;
}
