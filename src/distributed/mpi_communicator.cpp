// The MPI communicator (built when CMake finds MPI: RIFTCO_MPI). Every MPI
// call is checked: a failure is a CommunicationError naming the collective,
// the MPI call and the rank. Sums are taken in rank order by this file, not
// by MPI_Allreduce (whose order is implementation-defined): a reduce-scatter
// over MPI_Alltoallv where each rank sums its block in rank order, then an
// MPI_Allgatherv of the summed blocks. Each element is summed once, by one
// rank, so every rank gets the same bits, and the same bits run to run.
// The C API only: mpi.h would otherwise pull in the removed MPI-2 C++ bindings
// (libmpi_cxx), which we neither use nor link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.hpp"
#include "mpi_world.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer::distributed_detail {
namespace {

// Elements per MPI call in all_reduce_sum and broadcast: keeps counts in int
// range and the all-reduce's scratch buffer at most 64 MiB.
constexpr std::size_t kChunk = std::size_t{1} << 24;

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator()
      : wait_limit_(seconds_from_environment("RIFTCO_MPI_WAIT_TIMEOUT", 600.0)),
        exit_limit_(seconds_from_environment("RIFTCO_MPI_EXIT_TIMEOUT", 120.0)) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        throw CommunicationError("[communicator] MPI_Init_thread failed");
      }
#ifdef __GLIBC__
      on_exit(finalize_at_exit, nullptr);  // sees the exit status
#else
      std::atexit([] { finalize_at_exit(0, nullptr); });
#endif
    }
    // Our own communicator, returning errors instead of aborting, so each
    // failure becomes a typed error naming the call.
    if (MPI_Comm_dup(MPI_COMM_WORLD, &comm_) != MPI_SUCCESS) {
      throw CommunicationError("[communicator] MPI_Comm_dup(MPI_COMM_WORLD) failed");
    }
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "communicator", "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "communicator", "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "communicator", "MPI_Comm_size");
    self_ = this;
    std::set_terminate(terminate_job);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string_view kind() const override { return "mpi"; }

  void all_reduce_sum(std::span<float> values) override {
    drain("all_reduce_sum");
    if (size_ == 1) return;
    for (std::size_t start = 0; start < values.size(); start += kChunk) {
      all_reduce_chunk(values.subspan(start, std::min(kChunk, values.size() - start)));
    }
  }

  std::unique_ptr<CollectiveRequest> start_all_reduce_sum(std::span<float> values) override {
    auto request = std::make_unique<AllReduceRequest>(*this, values);
    if (size_ > 1 && !values.empty()) queue_.push_back(request.get());
    progress();  // posts its first exchange when no earlier request is in flight
    return request;
  }

  void reduce_scatter_sum(std::span<const float> input, std::span<float> output) override {
    check_reduce_scatter(input.size(), output.size(), size_);
    drain("reduce_scatter_sum");
    const int m = count(output.size(), "reduce_scatter_sum");
    scratch_.resize(input.size());
    // (world, m): row r is rank r's block for this rank.
    check(MPI_Alltoall(input.data(), m, MPI_FLOAT, scratch_.data(), m, MPI_FLOAT, comm_), "reduce_scatter_sum",
          "MPI_Alltoall");
    sum_rows(scratch_.data(), static_cast<std::size_t>(m), output.data());
  }

  void all_gather(std::span<const float> input, std::span<float> output) override {
    check_all_gather(input.size(), output.size(), size_);
    drain("all_gather");
    const int m = count(input.size(), "all_gather");
    check(MPI_Allgather(input.data(), m, MPI_FLOAT, output.data(), m, MPI_FLOAT, comm_), "all_gather",
          "MPI_Allgather");
  }

  void broadcast(std::span<float> values, int root) override {
    check_root(root, size_);
    drain("broadcast");
    for (std::size_t start = 0; start < values.size(); start += kChunk) {
      const auto n = static_cast<int>(std::min(kChunk, values.size() - start));
      check(MPI_Bcast(values.data() + start, n, MPI_FLOAT, root, comm_), "broadcast", "MPI_Bcast");
    }
  }

  void barrier() override {
    drain("barrier");
    check(MPI_Barrier(comm_), "barrier", "MPI_Barrier");
  }

  [[noreturn]] void abort(std::string_view message, int code) override {
    // One write(2) of the whole line: ranks aborting at the same moment share
    // mpirun's stderr, and separate writes of the pieces interleave there
    // (seen: "[riftco rank [riftco rank 1/2] ...").
    const std::string line =
        "[riftco rank " + std::to_string(rank_) + "/" + std::to_string(size_) + "] " + std::string(message) + "\n";
    std::cerr.flush();
    for (std::size_t done = 0; done < line.size();) {
      const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    MPI_Abort(MPI_COMM_WORLD, code == 0 ? 1 : code);
    std::_Exit(code == 0 ? 1 : code);  // MPI_Abort does not return; in case it does
  }

 private:
  // The non-blocking all_reduce_sum: per chunk of at most kChunk elements,
  // MPI_Ialltoallv of the blocks, this rank's block summed in rank order,
  // MPI_Iallgatherv of the summed blocks: the same bits as all_reduce_chunk.
  //
  // MPI matches collectives by the order each rank posts them, and a
  // request posts its second call only once its first completed, which
  // depends on timing. So requests run one after another in start order
  // (queue_): only the oldest unfinished one posts, and every blocking
  // collective first waits for the queue to empty. The order of posts is
  // then the order of the calls, the same on every rank whatever the timing.
  // test() on any request advances the queue as far as MPI's progress allows.
  class AllReduceRequest final : public CollectiveRequest {
   public:
    AllReduceRequest(MpiCommunicator& comm, std::span<float> values)
        : comm_(comm), values_(values), buffers_(std::make_unique<Buffers>()) {
      if (comm_.size_ == 1 || values.empty()) stage_ = Stage::Done;
    }
    AllReduceRequest(const AllReduceRequest&) = delete;
    AllReduceRequest& operator=(const AllReduceRequest&) = delete;
    ~AllReduceRequest() override {
      if (stage_ == Stage::Done) return;
      // Abandoned (a failed pass): MPI may still write into its buffers
      // (and the caller's values), so they are kept; the job is out of step.
      static_cast<void>(buffers_.release());
      std::erase(comm_.queue_, this);
    }

    bool test() override {
      if (stage_ != Stage::Done) comm_.progress();
      return stage_ == Stage::Done;
    }

    void wait() override { comm_.wait_for(*this, "all_reduce_sum"); }

    /// Posts and completes what MPI allows; true once done. Only the queue's head calls it.
    bool advance() {
      for (;;) {
        switch (stage_) {
          case Stage::Done:
            return true;
          case Stage::Failed:
            throw CommunicationError("[all_reduce_sum] a non-blocking all-reduce on rank " +
                                     std::to_string(comm_.rank_) + " of " + std::to_string(comm_.size_) +
                                     " failed earlier; the ranks are out of step");
          case Stage::Post:
            if (next_ >= values_.size()) {
              stage_ = Stage::Done;
              return true;
            }
            guarded([&] { post_exchange(); });
            stage_ = Stage::Exchange;
            break;
          case Stage::Exchange:
            if (!poll("MPI_Ialltoallv")) return false;
            guarded([&] { post_gather(); });
            stage_ = Stage::Gather;
            break;
          case Stage::Gather:
            if (!poll("MPI_Iallgatherv")) return false;
            next_ += chunk().size();
            stage_ = Stage::Post;
            break;
        }
      }
    }

    bool done() const { return stage_ == Stage::Done; }
    std::size_t size() const { return values_.size(); }

   private:
    enum class Stage { Post, Exchange, Gather, Done, Failed };
    struct Buffers {
      std::vector<int> counts, displs, recv_counts, recv_displs;
      std::vector<float> scratch;
    };

    std::span<float> chunk() const { return values_.subspan(next_, std::min(kChunk, values_.size() - next_)); }

    template <class F>
    void guarded(F&& f) {
      try {
        f();
      } catch (...) {
        stage_ = Stage::Failed;
        throw;
      }
    }

    bool poll(const char* call) {
      int done = 0;
      const int code = MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS) {
        stage_ = Stage::Failed;
        comm_.check(code, "all_reduce_sum", call);
      }
      return done != 0;
    }

    void post_exchange() {
      const std::span<float> values = chunk();
      const auto n = values.size();
      const auto world = static_cast<std::size_t>(comm_.size_);
      Buffers& b = *buffers_;
      b.counts.resize(world);
      b.displs.resize(world);
      for (std::size_t r = 0, offset = 0; r < world; ++r) {
        b.counts[r] = static_cast<int>(n / world + (r < n % world ? 1 : 0));
        b.displs[r] = static_cast<int>(offset);
        offset += static_cast<std::size_t>(b.counts[r]);
      }
      const int mine = b.counts[static_cast<std::size_t>(comm_.rank_)];
      b.recv_counts.assign(world, mine);
      b.recv_displs.resize(world);
      for (std::size_t r = 0; r < world; ++r) b.recv_displs[r] = static_cast<int>(r) * mine;
      b.scratch.resize(world * static_cast<std::size_t>(mine));  // (world, mine)
      comm_.check(MPI_Ialltoallv(values.data(), b.counts.data(), b.displs.data(), MPI_FLOAT, b.scratch.data(),
                                 b.recv_counts.data(), b.recv_displs.data(), MPI_FLOAT, comm_.comm_, &request_),
                  "all_reduce_sum", "MPI_Ialltoallv");
    }

    void post_gather() {
      const std::span<float> values = chunk();
      Buffers& b = *buffers_;
      const auto rank = static_cast<std::size_t>(comm_.rank_);
      comm_.sum_rows(b.scratch.data(), static_cast<std::size_t>(b.counts[rank]), values.data() + b.displs[rank]);
      comm_.check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), b.counts.data(),
                                  b.displs.data(), MPI_FLOAT, comm_.comm_, &request_),
                  "all_reduce_sum", "MPI_Iallgatherv");
    }

    MpiCommunicator& comm_;
    std::span<float> values_;
    std::unique_ptr<Buffers> buffers_;
    std::size_t next_ = 0;
    Stage stage_ = Stage::Post;
    MPI_Request request_ = MPI_REQUEST_NULL;
  };

  /// Advances the queue of non-blocking requests from its head.
  void progress() {
    while (!queue_.empty()) {
      if (!queue_.front()->advance()) return;
      queue_.pop_front();
    }
  }

  /// Polls until `request` is done, at most RIFTCO_MPI_WAIT_TIMEOUT seconds
  /// (default 600): a rank that never joins is a CommunicationError here,
  /// not a hang.
  void wait_for(AllReduceRequest& request, const char* op) {
    const double limit = wait_limit_;
    const double start = MPI_Wtime();
    for (std::uint64_t spins = 0; !request.done(); ++spins) {
      progress();
      if (request.done()) break;
      if (spins % 256 == 255 && MPI_Wtime() - start > limit) {
        throw CommunicationError(std::string("[") + op + "] rank " + std::to_string(rank_) + " of " +
                                 std::to_string(size_) + " waited more than " + std::to_string(limit) +
                                 " s (RIFTCO_MPI_WAIT_TIMEOUT) for a non-blocking all-reduce of " +
                                 std::to_string(request.size()) + " elements: another rank did not take part");
      }
      std::this_thread::yield();
    }
  }

  /// Before a blocking collective: every started request finishes first, so
  /// all ranks post in the same order.
  void drain(const char* op) {
    while (!queue_.empty()) wait_for(*queue_.back(), op);
  }

  // One all-reduce of at most kChunk elements: rank r sums block r (rank
  // order), then every rank gathers every block.
  void all_reduce_chunk(std::span<float> values) {
    const auto n = values.size();
    const auto world = static_cast<std::size_t>(size_);
    counts_.resize(world);
    displs_.resize(world);
    for (std::size_t r = 0, offset = 0; r < world; ++r) {
      counts_[r] = static_cast<int>(n / world + (r < n % world ? 1 : 0));
      displs_[r] = static_cast<int>(offset);
      offset += static_cast<std::size_t>(counts_[r]);
    }
    const int mine = counts_[static_cast<std::size_t>(rank_)];
    recv_counts_.assign(world, mine);
    recv_displs_.resize(world);
    for (std::size_t r = 0; r < world; ++r) recv_displs_[r] = static_cast<int>(r) * mine;
    scratch_.resize(world * static_cast<std::size_t>(mine));  // (world, mine)
    check(MPI_Alltoallv(values.data(), counts_.data(), displs_.data(), MPI_FLOAT, scratch_.data(),
                        recv_counts_.data(), recv_displs_.data(), MPI_FLOAT, comm_),
          "all_reduce_sum", "MPI_Alltoallv");
    sum_rows(scratch_.data(), static_cast<std::size_t>(mine),
             values.data() + displs_[static_cast<std::size_t>(rank_)]);
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), counts_.data(), displs_.data(),
                         MPI_FLOAT, comm_),
          "all_reduce_sum", "MPI_Allgatherv");
  }

  // out[i] = ((rows[0][i] + rows[1][i]) + rows[2][i]) + ...; rows is (world, m).
  void sum_rows(const float* rows, std::size_t m, float* out) const {
    std::copy(rows, rows + m, out);
    for (int r = 1; r < size_; ++r) {
      const float* row = rows + static_cast<std::size_t>(r) * m;
      for (std::size_t i = 0; i < m; ++i) out[i] += row[i];
    }
  }

  int count(std::size_t n, const char* op) const {
    if (n > static_cast<std::size_t>(INT_MAX)) {
      throw CommunicationError(std::string("[") + op + "] " + std::to_string(n) +
                               " elements per rank: more than an MPI count holds (" + std::to_string(INT_MAX) +
                               ")");
    }
    return static_cast<int>(n);
  }

  void check(int code, const char* op, const char* call) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw CommunicationError(std::string("[") + op + "] " + call + " failed on rank " + std::to_string(rank_) +
                             " of " + std::to_string(size_) + ": " + std::string(text, static_cast<std::size_t>(length)));
  }

  // At exit. A non-zero status (main returned an error, exit(1)) aborts the
  // job with a message: the other ranks may be waiting in a collective for
  // this one, and MPI_Finalize would wait for them. Status 0 finalizes after
  // a barrier bounded by RIFTCO_MPI_EXIT_TIMEOUT seconds (default 120): a rank
  // that left early while the others still wait aborts the job instead of
  // hanging in MPI_Finalize.
  static void finalize_at_exit(int status, void* /*unused*/) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || self_ == nullptr) return;
    if (status != 0) {
      self_->abort("exiting with status " + std::to_string(status) + " (see the message above); ending every rank",
                   status);
    }
    const double limit = self_->exit_limit_;
    MPI_Request request = MPI_REQUEST_NULL;
    int done = 0;
    if (MPI_Ibarrier(self_->comm_, &request) == MPI_SUCCESS) {
      const double start = MPI_Wtime();
      while (!done && MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && MPI_Wtime() - start < limit) {
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (!done) {
      self_->abort("exited while other ranks had not reached exit within " + std::to_string(limit) +
                       " s (RIFTCO_MPI_EXIT_TIMEOUT): ending every rank",
                   1);
    }
    MPI_Finalize();
  }

  // An exception that escapes main (or any other std::terminate) ends the
  // whole job with its message instead of leaving the other ranks waiting.
  [[noreturn]] static void terminate_job() {
    std::string message = "terminate called without an active exception";
    if (const auto current = std::current_exception()) {
      try {
        std::rethrow_exception(current);
      } catch (const std::exception& e) {
        message = std::string("uncaught exception: ") + e.what();
      } catch (...) {
        message = "uncaught exception of a non-standard type";
      }
    }
    self_->abort(message, 1);
  }

  static inline MpiCommunicator* self_ = nullptr;
  double wait_limit_;  // RIFTCO_MPI_WAIT_TIMEOUT
  double exit_limit_;  // RIFTCO_MPI_EXIT_TIMEOUT
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<float> scratch_;
  std::vector<int> counts_, displs_, recv_counts_, recv_displs_;
  std::deque<AllReduceRequest*> queue_;  // started, unfinished non-blocking all-reduces, in start order
};

}  // namespace

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

Communicator& mpi_world() {
  // Never destroyed: the exit handler (finalize_at_exit, registered while it
  // is being built) runs after static destructors and still uses it.
  static MpiCommunicator* const world = new MpiCommunicator();
  return *world;
}

}  // namespace riftco_transformer::distributed_detail
