// A run's output directory: typed file-system steps, the metrics log a
// resume continues, the loss-curve plot and the final files (rank 0 alone
// calls these under data parallelism).
#include "run_directory.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "../io/atomic_file.hpp"
#include "../io/json_read.hpp"
#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/plot.hpp"
#include "training_checkpoint.hpp"

namespace riftco_transformer::stage {
namespace {

constexpr const char* kLossCurveFile = "loss_curve.svg";

/// The fields of a metrics.jsonl row (StepReport).
constexpr const char* kMetricsFields[] = {"step",           "loss",          "learning_rate", "grad_norm",
                                          "tokens_per_second", "elapsed_seconds", "peak_bytes", "validation_loss",
                                          "activation_peak_bytes"};

}  // namespace

/// File-system steps of a run with typed errors: a failure is a
/// ModelStateError "[save] <path>: cannot ...: <reason>" (never a raw
/// std::filesystem error).
void make_directory(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    throw ModelStateError("[save] " + dir.string() + ": cannot create the output directory: " +
                          (ec ? ec.message() : std::string("a file of that name exists")));
  }
}

void remove_file(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) throw ModelStateError("[save] " + path.string() + ": cannot remove it: " + ec.message());
}

bool file_exists(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

RunLock::RunLock(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / ".lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int error = errno;
    throw ModelStateError("[save] " + path.string() + ": cannot open the run's lock file: " + std::strerror(error));
  }
  int result = 0;
  do {
    result = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (result != 0 && errno == EINTR);
  if (result != 0 && errno == EWOULDBLOCK) {
    ::close(fd_);
    fd_ = -1;
    throw Error("[pipeline] another run is using " + dir.string() +
                " (it holds " + path.string() + "): wait for it to end, or choose another output directory");
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

MetricsAppender::~MetricsAppender() { close(); }

void MetricsAppender::open(const std::filesystem::path& path) {
  close();
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int error = errno;
    throw Error("[pipeline] cannot open " + path.string() + ": " + std::strerror(error));
  }
  path_ = path;
}

void MetricsAppender::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void MetricsAppender::append(const std::string& line) {
  const std::string data = line + '\n';
  struct stat before {};
  int error = ::fstat(fd_, &before) != 0 ? errno : 0;
  std::size_t done = 0;
  while (error == 0 && done < data.size()) {
    const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  if (error == 0) return;
  // A partial write (the disk filled up inside it) would leave a torn line:
  // the file goes back to the rows before this one.
  std::string restored;
  if (done > 0 && ::ftruncate(fd_, before.st_size) != 0) {
    restored = std::string(" (and it could not be cut back to its ") + std::to_string(before.st_size) +
               " bytes: " + std::strerror(errno) + "; --resume drops the torn last line)";
  }
  throw Error("[pipeline] cannot append to " + path_.string() + ": " + std::strerror(error) +
              (error == ENOSPC ? " (the disk is full)" : "") + restored +
              "; --resume continues from the last checkpoint");
}

/// Rows of a metrics file with step <= `keep` (a resumed run continues the
/// log). Our own file, but read as untrusted: a damaged line is an error
/// naming the file, the line and the field, never a raw JSON exception.
std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path, std::int64_t keep) {
  std::vector<nlohmann::json> rows;
  std::string text;
  if (const auto why = read_regular_file(path, text, std::uint64_t{1} << 30)) {  // 1 GiB: millions of rows
    if (!file_exists(path) && keep == 0) return rows;
    if (!file_exists(path)) {
      throw Error("[resume] " + path.string() + ": the metrics log is missing, but the training checkpoint is at "
                  "step " + std::to_string(keep) + ": the rows of steps 1 to " + std::to_string(keep) +
                  " are gone (put the log back, or start the run over: drop resume, or delete " +
                  (path.parent_path() / kTrainingCheckpointFile).string() + ")");
    }
    throw Error("[resume] " + path.string() + ": " + *why);
  }
  std::size_t pos = 0;
  std::int64_t line_number = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    // Every row is appended with its newline: a last line without one was
    // torn by a crash or a full disk inside the append, so never written.
    if (end == std::string::npos) break;
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    try {
      const detail::Json row = detail::parse_untrusted_json(line);
      const std::int64_t step = detail::json_integer(row, "step", 1, std::numeric_limits<std::int64_t>::max());
      detail::json_number(row, "loss", true);  // NaN is written as null
      if (row.contains("validation_loss")) detail::json_number(row, "validation_loss", true);
      if (step > keep) continue;
      // The rows a resume keeps are steps 1..keep, each once, in order.
      if (step != static_cast<std::int64_t>(rows.size()) + 1) {
        throw detail::JsonReadError("\"step\" is " + std::to_string(step) + " where step " +
                                    std::to_string(rows.size() + 1) + " was expected (a duplicate or missing step)");
      }
      // Only the fields a run writes go on into the final log (an edited
      // line's extra keys do not).
      nlohmann::json plain = nlohmann::json::object();
      for (const char* key : kMetricsFields) {
        if (!row.contains(key)) continue;
        const detail::Json& v = row.at(key);
        if (!v.is_number() && !v.is_null()) {
          throw detail::JsonReadError(std::string("\"") + key + "\" must be a number, got " + detail::quote_json(v));
        }
        if (v.is_null()) {
          plain[key] = std::numeric_limits<double>::quiet_NaN();
        } else if (v.is_number_integer()) {
          plain[key] = v.get<std::int64_t>();
        } else {
          plain[key] = v.get<double>();
        }
      }
      plain["step"] = step;
      rows.push_back(std::move(plain));
    } catch (const detail::JsonReadError& e) {
      throw Error("[resume] " + path.string() + ": line " + std::to_string(line_number) + ": " + detail::line_error(e) +
                  " (the metrics log is damaged: repair the line, which must be step " +
                  std::to_string(rows.size() + 1) + "'s row as the run wrote it (removing it leaves a step " +
                  "missing), or start the run over)");
    }
  }
  if (static_cast<std::int64_t>(rows.size()) != keep) {
    throw Error("[resume] " + path.string() + ": the log's " + std::to_string(line_number) + " lines end at step " +
                std::to_string(rows.size()) + " but the training checkpoint is at step " + std::to_string(keep) +
                " (the metrics log is damaged: start the run over)");
  }
  return rows;
}

namespace {

/// loss_curve.svg: train and validation loss against step.
void write_plots(const std::filesystem::path& dir, const std::vector<nlohmann::json>& rows, const std::string& title) {
  CurveSeries train{"train loss", {}, 0x1F77B4};
  CurveSeries validation{"validation loss", {}, 0xD62728};
  for (const nlohmann::json& row : rows) {
    const auto step = static_cast<double>(row["step"].get<std::int64_t>());
    const auto number = [](const nlohmann::json& v) {
      return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
    };
    train.points.emplace_back(step, number(row["loss"]));
    if (row.contains("validation_loss")) validation.points.emplace_back(step, number(row["validation_loss"]));
  }
  std::vector<CurveSeries> series{train};
  if (!validation.points.empty()) series.push_back(validation);
  write_loss_curve_svg(dir / kLossCurveFile, series, title);
}

}  // namespace

void check_output_targets(const StageRun& r) {
  const std::filesystem::path dir = r.settings->output_dir;
  for (const std::string& name : {r.weights_file, std::string("metadata.json"), std::string("metrics.jsonl"),
                                  std::string(kLossCurveFile), std::string(kTrainingCheckpointFile),
                                  std::string(kPartialMetricsFile)}) {
    try {
      detail::check_replaceable(dir / name);
    } catch (const ModelStateError& e) {
      throw ModelStateError(std::string(e.what()) + " (the run writes this file; checked before training so that "
                                                    "no step is lost: move it away or use another output directory)");
    }
  }
}

void check_inputs_are_not_outputs(const std::filesystem::path& output_dir,
                                  std::initializer_list<std::pair<const char*, std::filesystem::path>> inputs,
                                  const char* op) {
  for (const auto& [field, input] : inputs) {
    if (input.empty()) continue;
    for (const std::string_view name : kRunFileNames) {
      if (same_file(output_dir / std::string(name), input)) {
        throw ValueError(std::string("[") + op + "] " + field + " " + input.string() + " is " +
                         (output_dir / std::string(name)).string() +
                         ", a file this run writes or removes in output_dir: it would be replaced after training "
                         "on it; move it or choose another output_dir");
      }
    }
  }
}

void check_paths_are_text(std::initializer_list<std::pair<const char*, std::filesystem::path>> paths, const char* op) {
  for (const auto& [field, path] : paths) {
    const std::string& text = path.native();
    if (const auto bad = first_invalid_utf8(text)) {
      throw ValueError(std::string("[") + op + "] " + field + " is not valid UTF-8 text (byte " +
                       std::to_string(*bad) + " of the path): the run records its paths in metadata.json as JSON "
                       "text; rename the file or directory");
    }
  }
}

/// Completion, by rank 0 alone: switches the directory to this run and
/// returns the weights' path. metadata.json marks a complete run, so it goes
/// first and comes back last: a failure in between leaves an interrupted run
/// (resumable while its checkpoint is there), never a directory that claims
/// to be complete with mixed files.
std::filesystem::path write_final_files(StageRun& r, const RunResult& result, const std::vector<nlohmann::json>& rows,
                                        int world_size, const nlohmann::json& world_size_history) {
  const std::filesystem::path dir = r.settings->output_dir;
  const std::filesystem::path metadata_path = dir / "metadata.json";
  remove_file(metadata_path);
  const std::filesystem::path weights = dir / r.weights_file;
  r.save_weights(weights);
  {
    std::string all;
    for (const nlohmann::json& row : rows) all += row.dump() + '\n';
    write_file_atomically(dir / "metrics.jsonl", all);
  }
  write_plots(dir, rows, r.stage + " loss");
  nlohmann::json metadata = {
      {"stage", r.stage},
      {"config", r.config},
      {"world_size", world_size},
      {"world_size_history", world_size_history},
      {"results",
       {{"steps", result.steps},
        {"resumed_from_step", result.resumed_from_step},
        {"final_train_loss", result.final_train_loss},
        {"final_validation_loss", result.final_validation_loss},
        {"tokens_per_second", result.tokens_per_second},
        {"peak_memory_bytes", result.peak_bytes},
        {"activation_peak_bytes", result.activation_peak_bytes}}},
      {"facts", r.facts},
      {"files",
       {{"weights", weights.filename().string()}, {"metrics", "metrics.jsonl"}, {"loss_curve", "loss_curve.svg"}}}};
  write_file_atomically(metadata_path, metadata.dump(2) + "\n");
  // The partial log before the checkpoint: a kill between the two leaves a
  // checkpoint beside complete files, which resume finishes again from the
  // checkpoint with metrics.jsonl's rows (never a "complete" directory that
  // still holds a partial log).
  remove_file(dir / kPartialMetricsFile);
  remove_file(dir / kTrainingCheckpointFile);  // the run is complete
  remove_stale_temporaries(dir, kRunFileNames);
  return weights;
}

}  // namespace riftco_transformer::stage
