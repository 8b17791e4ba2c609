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

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <exception>
#include <iostream>
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
  MpiCommunicator() {
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
    if (size_ == 1) return;
    for (std::size_t start = 0; start < values.size(); start += kChunk) {
      all_reduce_chunk(values.subspan(start, std::min(kChunk, values.size() - start)));
    }
  }

  void reduce_scatter_sum(std::span<const float> input, std::span<float> output) override {
    check_reduce_scatter(input.size(), output.size(), size_);
    const int m = count(output.size(), "reduce_scatter_sum");
    scratch_.resize(input.size());
    // (world, m): row r is rank r's block for this rank.
    check(MPI_Alltoall(input.data(), m, MPI_FLOAT, scratch_.data(), m, MPI_FLOAT, comm_), "reduce_scatter_sum",
          "MPI_Alltoall");
    sum_rows(scratch_.data(), static_cast<std::size_t>(m), output.data());
  }

  void all_gather(std::span<const float> input, std::span<float> output) override {
    check_all_gather(input.size(), output.size(), size_);
    const int m = count(input.size(), "all_gather");
    check(MPI_Allgather(input.data(), m, MPI_FLOAT, output.data(), m, MPI_FLOAT, comm_), "all_gather",
          "MPI_Allgather");
  }

  void broadcast(std::span<float> values, int root) override {
    check_root(root, size_);
    for (std::size_t start = 0; start < values.size(); start += kChunk) {
      const auto n = static_cast<int>(std::min(kChunk, values.size() - start));
      check(MPI_Bcast(values.data() + start, n, MPI_FLOAT, root, comm_), "broadcast", "MPI_Bcast");
    }
  }

  void barrier() override { check(MPI_Barrier(comm_), "barrier", "MPI_Barrier"); }

  [[noreturn]] void abort(std::string_view message, int code) override {
    std::cerr << "[riftco rank " << rank_ << "/" << size_ << "] " << message << std::endl;
    MPI_Abort(MPI_COMM_WORLD, code == 0 ? 1 : code);
    std::_Exit(code == 0 ? 1 : code);  // MPI_Abort does not return; in case it does
  }

 private:
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
    double limit = 120.0;
    if (const char* text = std::getenv("RIFTCO_MPI_EXIT_TIMEOUT")) limit = std::atof(text);
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
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<float> scratch_;
  std::vector<int> counts_, displs_, recv_counts_, recv_displs_;
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
