#pragma once
// A run's output directory (stage_loop.cpp): typed file-system steps, the
// metrics log a resume continues, and the files a completed run writes.
// Private to the train layer.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "stage_loop.hpp"
#include "training_checkpoint.hpp"

namespace riftco_transformer::stage {

/// Every file a run writes or removes in its output directory: the inputs
/// that must not be one of them, and the only names whose stale temporaries
/// (".<name>.tmp.<pid>.<n>") a run removes there.
inline constexpr std::string_view kRunFileNames[] = {
    "model.safetensors", "adapter.safetensors", "metadata.json", "metrics.jsonl",  "loss_curve.svg",
    "loss_curve.png" /* riftco.plot's, beside the run's files */, kTrainingCheckpointFile, kPartialMetricsFile, ".lock", ".write_probe"};

/// File-system steps with typed errors: a failure is a ModelStateError
/// "[save] <path>: cannot ...: <reason>" (never a raw std::filesystem error).
void make_directory(const std::filesystem::path& dir);
void remove_file(const std::filesystem::path& path);
bool file_exists(const std::filesystem::path& path);

/// An exclusive, non-blocking flock(2) on DIR/.lock for a run's lifetime:
/// a second run into the same directory is refused ("another run is using
/// DIR") before it changes anything. The file stays (removing it would let
/// two runs lock two different files); the lock goes with the process.
/// A file system without locks (flock: ENOLCK, EOPNOTSUPP) runs unlocked.
class RunLock {
 public:
  explicit RunLock(const std::filesystem::path& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

/// The metrics log a run in progress appends to (metrics.partial.jsonl), one
/// row per line. An append that fails (a full disk) cuts the file back to
/// its length before it, so no torn line is left, and throws an Error
/// naming the file and the reason ("--resume continues from the last
/// checkpoint").
class MetricsAppender {
 public:
  MetricsAppender() = default;
  ~MetricsAppender();
  MetricsAppender(const MetricsAppender&) = delete;
  MetricsAppender& operator=(const MetricsAppender&) = delete;
  void open(const std::filesystem::path& path);
  /// `line` and a newline, whole or not at all.
  void append(const std::string& line);
  void close();

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

/// Rows of a metrics file with step <= `keep` (a resumed run continues the
/// log). Our own file, but read as untrusted: a damaged line is an Error
/// naming the file, the line and the field, never a raw JSON exception. A
/// last line without its newline is an append that never completed (torn
/// by a crash or a full disk): it was never written, and is dropped. A
/// missing file is an Error when `keep` > 0 (its steps are gone).
std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path, std::int64_t keep);

/// Every file a run may write in `r`'s output directory (the weights,
/// metadata.json, metrics.jsonl, loss_curve.svg, the training checkpoint and
/// the partial log), checked at setup with the writer's own check
/// (check_replaceable): a directory, symlink, FIFO or device in the way is a
/// ModelStateError before step 1, not after training.
void check_output_targets(const StageRun& r);

/// Completion: the weights (r.save_weights), metrics.jsonl, loss_curve.svg
/// and metadata.json (recording world_size and world_size_history), then the checkpoint and the
/// partial log removed. Returns the weights' path. metadata.json goes first
/// and comes back last, so a failure in between leaves an interrupted run,
/// never a directory that claims to be complete with mixed files.
std::filesystem::path write_final_files(StageRun& r, const RunResult& result, const std::vector<nlohmann::json>& rows,
                                        int world_size, const nlohmann::json& world_size_history);

}  // namespace riftco_transformer::stage
