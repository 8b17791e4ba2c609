// The NCCL communicator (RIFTCO_NCCL builds): CUDA tensors over NCCL, host
// spans over the communicator it was bootstrapped from (MPI under mpirun,
// single-process otherwise), so host collectives keep their bits.
//
// Bits. NCCL's own reductions (ncclAllReduce, ncclReduceScatter) sum in an
// order that depends on the algorithm, protocol and topology NCCL picks, so
// they are not used. As in the MPI communicator, all_reduce_sum is a
// reduce-scatter built from data movement (grouped ncclSend/ncclRecv: rank r
// receives block r of every rank), a rank-order sum of this rank's block by
// our kernel (nccl_kernels.cu: ((x_0 + x_1) + x_2) + ...), then an
// all-gather of the summed blocks (grouped ncclBroadcast, one per block: the
// blocks differ in size by one). The blocks are the MPI communicator's, and
// each element is summed once, by one rank, in rank order: the same bits on
// every rank, run to run, and the same bits as the MPI and single-process
// communicators on the same inputs, whatever NCCL's algorithm or transport.
//
// Streams. Every collective runs on the communicator's own non-blocking
// stream, after the work queued so far on the legacy default stream (where
// every riftco kernel runs: one event), and records an event when done. A
// blocking collective polls that event; a started one (start_all_reduce_sum)
// returns a request whose test() queries it and whose wait() polls it. All
// waits, and NCCL's own calls (the communicator is non-blocking: ncclInProgress
// is polled), are bounded by RIFTCO_NCCL_WAIT_TIMEOUT seconds (default 600);
// past it, or on an error NCCL reports (ncclCommGetAsyncError), the
// communicator is aborted (ncclCommAbort) and a CommunicationError names the
// collective, the call and the rank; every later collective is refused.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collective_checks.hpp"
#include "nccl_bootstrap.hpp"
#include "nccl_kernels.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/memory.hpp"

namespace riftco_transformer::distributed_detail {
namespace {

// Elements per all-reduce chunk: bounds the scratch (world x block) at 64 MiB.
constexpr std::size_t kChunk = std::size_t{1} << 24;

/// Device memory from the counted allocator, freed on destruction unless
/// released (an abandoned collective may still write into it).
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(std::size_t elements)
      : bytes_(elements * sizeof(float)),
        data_(static_cast<float*>(riftco_transformer::detail::allocate_bytes(Backend::Cuda, bytes_))) {}
  Scratch(Scratch&& other) noexcept : bytes_(other.bytes_), data_(other.data_) { other.data_ = nullptr; }
  Scratch& operator=(Scratch&& other) noexcept {
    std::swap(bytes_, other.bytes_);
    std::swap(data_, other.data_);
    return *this;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (data_ != nullptr) riftco_transformer::detail::free_bytes(Backend::Cuda, data_, bytes_);
  }
  float* get() const { return data_; }
  void release() { data_ = nullptr; }

 private:
  std::size_t bytes_ = 0;
  float* data_ = nullptr;
};

/// Block r of n elements over `world` ranks: the MPI communicator's split
/// (sizes differ by at most one, the first n % world one larger).
struct Blocks {
  std::vector<std::size_t> counts, displs;
  Blocks(std::size_t n, int world) : counts(static_cast<std::size_t>(world)), displs(static_cast<std::size_t>(world)) {
    const auto w = static_cast<std::size_t>(world);
    for (std::size_t r = 0, offset = 0; r < w; ++r) {
      counts[r] = n / w + (r < n % w ? 1 : 0);
      displs[r] = offset;
      offset += counts[r];
    }
  }
};

class NcclCommunicator;

/// A started all-reduce: done once its event on the communicator's stream has completed.
class DeviceRequest final : public CollectiveRequest {
 public:
  DeviceRequest(NcclCommunicator& comm, cudaEvent_t done, Scratch scratch, std::size_t elements)
      : comm_(comm), done_(done), scratch_(std::move(scratch)), elements_(elements) {}
  DeviceRequest(const DeviceRequest&) = delete;
  DeviceRequest& operator=(const DeviceRequest&) = delete;
  ~DeviceRequest() override;
  bool test() override;
  void wait() override;

 private:
  void finish();
  NcclCommunicator& comm_;
  cudaEvent_t done_;
  Scratch scratch_;
  std::size_t elements_;
  bool finished_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(Communicator& host)
      : host_(host), rank_(host.rank()), size_(host.world_size()), wait_limit_(nccl_wait_limit()) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      count = 0;  // agree_on_device refuses on every rank, naming the host
    }
    device_ = agree_on_device(host_, local_placement(host_, this_host_name()), count);
    cuda(cudaSetDevice(device_), "communicator", "cudaSetDevice");
    // Rank 0 makes the id; byte 128 says whether it could, so a failure there
    // stops every rank instead of leaving them in NCCL's initialization.
    std::vector<unsigned char> id_bytes(sizeof(ncclUniqueId) + 1, 0);
    std::string id_error;
    if (rank_ == 0) {
      ncclUniqueId id{};
      const ncclResult_t status = ncclGetUniqueId(&id);
      if (status == ncclSuccess) {
        std::memcpy(id_bytes.data(), &id, sizeof id);
        id_bytes.back() = 1;
      } else {
        id_error = ncclGetErrorString(status);
      }
    }
    broadcast_bytes(host_, id_bytes, 0);
    if (id_bytes.back() != 1) {
      throw CommunicationError("[communicator] ncclGetUniqueId failed on rank 0 of " + std::to_string(size_) +
                               (id_error.empty() ? std::string() : ": " + id_error) + " (seen by rank " +
                               std::to_string(rank_) + ")");
    }
    ncclUniqueId id{};
    std::memcpy(&id, id_bytes.data(), sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every NCCL call returns at once; settle() polls it, bounded
    nccl(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "communicator", "ncclCommInitRankConfig");
    settle("communicator", "ncclCommInitRankConfig");
    cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "communicator", "cudaStreamCreateWithFlags");
    cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "communicator", "cudaEventCreateWithFlags");
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      try {
        drain("communicator");
        nccl(ncclCommFinalize(comm_), "communicator", "ncclCommFinalize");
        settle("communicator", "ncclCommFinalize");
        ncclCommDestroy(comm_);
      } catch (const std::exception&) {
        // fail() aborted it; nothing else to release
      }
    }
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string_view kind() const override { return "nccl"; }
  bool accepts(Backend backend) const override { return backend == Backend::Cpu || backend == Backend::Cuda; }

  // Host spans: over the bootstrap communicator, after the device work started so far.
  void all_reduce_sum(std::span<float> values) override {
    drain("all_reduce_sum");
    host_.all_reduce_sum(values);
  }
  std::unique_ptr<CollectiveRequest> start_all_reduce_sum(std::span<float> values) override {
    return host_.start_all_reduce_sum(values);
  }
  void reduce_scatter_sum(std::span<const float> input, std::span<float> output) override {
    drain("reduce_scatter_sum");
    host_.reduce_scatter_sum(input, output);
  }
  void all_gather(std::span<const float> input, std::span<float> output) override {
    drain("all_gather");
    host_.all_gather(input, output);
  }
  void broadcast(std::span<float> values, int root) override {
    drain("broadcast");
    host_.broadcast(values, root);
  }
  void barrier() override {
    drain("barrier");
    host_.barrier();
  }
  [[noreturn]] void abort(std::string_view message, int code) override {
    if (comm_ != nullptr) ncclCommAbort(comm_);  // its kernels stop; the stream is left as it is
    comm_ = nullptr;
    host_.abort(message, code);
    std::_Exit(code == 0 ? 1 : code);  // host_.abort does not return; in case it does
  }

  /// Polls `event`: true once complete. A CommunicationError (after aborting
  /// the communicator) when CUDA or NCCL reports an error.
  bool poll(cudaEvent_t event, const char* op) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) {
      cudaGetLastError();
      fail(op, std::string("cudaEventQuery failed: ") + cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
    }
    check_async(op);
    return false;
  }

  /// Polls `event` until complete, at most RIFTCO_NCCL_WAIT_TIMEOUT seconds.
  void wait_for(cudaEvent_t event, const char* op, std::size_t elements) {
    const auto start = std::chrono::steady_clock::now();
    while (!poll(event, op)) {
      const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
      if (waited.count() > wait_limit_) {
        fail(op, "waited more than " + std::to_string(wait_limit_) +
                     " s (RIFTCO_NCCL_WAIT_TIMEOUT) for a collective of " + std::to_string(elements) +
                     " elements: another rank did not take part");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void refuse_if_broken(const char* op) const {
    if (!broken_.empty()) {
      throw CommunicationError(std::string("[") + op + "] the nccl communicator of rank " + std::to_string(rank_) +
                               " of " + std::to_string(size_) + " was aborted after an earlier failure (" + broken_ +
                               "); the ranks are out of step");
    }
  }

 protected:
  void device_all_reduce(Tensor& tensor, bool average) override {
    const char* op = average ? "all_reduce_average" : "all_reduce_sum";
    Pending pending = enqueue_all_reduce(tensor, average, op);
    keeping(pending.scratch, [&] { wait_for(pending.done, op, static_cast<std::size_t>(tensor.numel())); });
    cudaEventDestroy(pending.done);
  }

  std::unique_ptr<CollectiveRequest> device_start_all_reduce_sum(Tensor& tensor) override {
    Pending pending = enqueue_all_reduce(tensor, false, "all_reduce_sum");
    return std::make_unique<DeviceRequest>(*this, pending.done, std::move(pending.scratch),
                                           static_cast<std::size_t>(tensor.numel()));
  }

  void device_reduce_scatter_sum(const Tensor& input, Tensor& output) override {
    const char* op = "reduce_scatter_sum";
    const float* in = device_pointer(input, op);
    float* out = device_pointer(output, op);
    const auto m = static_cast<std::size_t>(output.numel());
    Scratch scratch(m * static_cast<std::size_t>(size_));  // (world, m): row r is rank r's block for this rank
    keeping(scratch, [&] {
      begin(op);
      group(op, [&] {
        for (int r = 0; r < size_ && m != 0; ++r) {
          nccl(ncclSend(in + static_cast<std::size_t>(r) * m, m, ncclFloat, r, comm_, stream_), op, "ncclSend");
          nccl(ncclRecv(scratch.get() + static_cast<std::size_t>(r) * m, m, ncclFloat, r, comm_, stream_), op,
               "ncclRecv");
        }
      });
      sum_rows(scratch.get(), m, false, out, op);
      finish_blocking(op, m);
    });
  }

  void device_all_gather(const Tensor& input, Tensor& output) override {
    const char* op = "all_gather";
    const float* in = device_pointer(input, op);
    float* out = device_pointer(output, op);
    const auto m = static_cast<std::size_t>(input.numel());
    begin(op);
    if (m != 0) {
      nccl(ncclAllGather(in, out, m, ncclFloat, comm_, stream_), op, "ncclAllGather");
      settle(op, "ncclAllGather");
    }
    finish_blocking(op, m * static_cast<std::size_t>(size_));
  }

  void device_broadcast(Tensor& tensor, int root) override {
    const char* op = "broadcast";
    float* values = device_pointer(tensor, op);
    const auto n = static_cast<std::size_t>(tensor.numel());
    begin(op);
    if (n != 0) {
      nccl(ncclBroadcast(values, values, n, ncclFloat, root, comm_, stream_), op, "ncclBroadcast");
      settle(op, "ncclBroadcast");
    }
    finish_blocking(op, n);
  }

 private:
  struct Pending {
    cudaEvent_t done = nullptr;
    Scratch scratch;
  };

  /// The all-reduce of `tensor` enqueued on the stream, chunk by chunk; the event records its end.
  Pending enqueue_all_reduce(Tensor& tensor, bool average, const char* op) {
    float* values = device_pointer(tensor, op);
    const auto n = static_cast<std::size_t>(tensor.numel());
    Pending pending;
    const auto world = static_cast<std::size_t>(size_);
    const std::size_t largest_block = (std::min(n, kChunk) + world - 1) / world;
    pending.scratch = Scratch(largest_block * world);  // (world, block) of one chunk, reused by the next
    keeping(pending.scratch, [&] {
      begin(op);
      for (std::size_t start = 0; start < n; start += kChunk) {
        all_reduce_chunk(values + start, std::min(kChunk, n - start), average, pending.scratch.get(), op);
      }
      pending.done = record(op);
    });
    return pending;
  }

  /// Runs `f`; when it throws, NCCL may still write into `scratch` (an
  /// aborted collective), so it is kept, never freed.
  template <class F>
  static void keeping(Scratch& scratch, F&& f) {
    try {
      f();
    } catch (...) {
      scratch.release();
      throw;
    }
  }

  // Rank r sums block r in rank order (received from every rank), then every
  // rank gets every block: the MPI communicator's all_reduce_chunk on the device.
  void all_reduce_chunk(float* values, std::size_t n, bool average, float* scratch, const char* op) {
    const Blocks blocks(n, size_);
    const std::size_t mine = blocks.counts[static_cast<std::size_t>(rank_)];
    group(op, [&] {
      for (int r = 0; r < size_; ++r) {
        const auto peer = static_cast<std::size_t>(r);
        if (blocks.counts[peer] != 0) {
          nccl(ncclSend(values + blocks.displs[peer], blocks.counts[peer], ncclFloat, r, comm_, stream_), op,
               "ncclSend");
        }
        if (mine != 0) nccl(ncclRecv(scratch + peer * mine, mine, ncclFloat, r, comm_, stream_), op, "ncclRecv");
      }
    });
    sum_rows(scratch, mine, average, values + blocks.displs[static_cast<std::size_t>(rank_)], op);
    group(op, [&] {  // an all-gather of unequal blocks: one broadcast per block
      for (int r = 0; r < size_; ++r) {
        const auto root = static_cast<std::size_t>(r);
        if (blocks.counts[root] == 0) continue;
        float* block = values + blocks.displs[root];
        nccl(ncclBroadcast(block, block, blocks.counts[root], ncclFloat, r, comm_, stream_), op, "ncclBroadcast");
      }
    });
  }

  void sum_rows(const float* rows, std::size_t m, bool average, float* out, const char* op) {
    cuda(launch_sum_rows(rows, m, size_, average && size_ > 1, static_cast<float>(size_), out, stream_), op,
         "launching the rank-order sum");
  }

  template <class F>
  void group(const char* op, F&& enqueue) {
    nccl(ncclGroupStart(), op, "ncclGroupStart");
    try {
      enqueue();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    nccl(ncclGroupEnd(), op, "ncclGroupEnd");
    settle(op, "ncclGroupEnd");
  }

  /// Before a device collective: usable, on our device, and after the compute stream's work so far.
  void begin(const char* op) {
    refuse_if_broken(op);
    cuda(cudaSetDevice(device_), op, "cudaSetDevice");
    cuda(cudaEventRecord(ready_, cudaStreamLegacy), op, "cudaEventRecord");
    cuda(cudaStreamWaitEvent(stream_, ready_, 0), op, "cudaStreamWaitEvent");
  }

  cudaEvent_t record(const char* op) {
    cuda(cudaSetDevice(device_), op, "cudaSetDevice");
    cudaEvent_t done = nullptr;
    cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), op, "cudaEventCreateWithFlags");
    const cudaError_t status = cudaEventRecord(done, stream_);
    if (status != cudaSuccess) {
      cudaEventDestroy(done);
      cuda(status, op, "cudaEventRecord");
    }
    return done;
  }

  void finish_blocking(const char* op, std::size_t elements) {
    const cudaEvent_t done = record(op);
    wait_for(done, op, elements);
    cudaEventDestroy(done);
  }

  /// Waits for every collective started so far (host collectives and the barrier come after them).
  void drain(const char* op) {
    if (!broken_.empty() || stream_ == nullptr) return;  // aborted: nothing of ours runs any more
    finish_blocking(op, 0);
  }

  /// The tensor's device pointer, on this communicator's device (a BackendError otherwise).
  const float* device_pointer(const Tensor& tensor, const char* op) const {
    const float* pointer = tensor.device_data();
    check_device(tensor, pointer, op);
    return pointer;
  }
  /// For writing: bumps the tensor's version.
  float* device_pointer(Tensor& tensor, const char* op) const {
    check_device(tensor, std::as_const(tensor).device_data(), op);
    return tensor.device_data();
  }

  void check_device(const Tensor& tensor, const void* pointer, const char* op) const {
    if (tensor.backend() != Backend::Cuda) {
      throw BackendError(std::string("[") + op + "] the nccl communicator takes cuda tensors; this one " +
                         shape_string(tensor.shape()) + " is on " + backend_name(tensor.backend()));
    }
    cudaPointerAttributes attributes{};
    const cudaError_t status = cudaPointerGetAttributes(&attributes, pointer);
    if (status != cudaSuccess) {
      cudaGetLastError();  // an unknown pointer leaves an error behind
      return;
    }
    if (attributes.type == cudaMemoryTypeDevice && attributes.device != device_) {
      throw BackendError(std::string("[") + op + "] rank " + std::to_string(rank_) + "'s tensor " +
                         shape_string(tensor.shape()) + " is on CUDA device " + std::to_string(attributes.device) +
                         " but its nccl communicator uses device " + std::to_string(device_) +
                         ": create the communicator (Communicator::world_for(Backend::Cuda)) before moving "
                         "tensors to CUDA, so they are made on the rank's device");
    }
  }

  /// In non-blocking mode an NCCL call may return ncclInProgress: polls
  /// ncclCommGetAsyncError until it is done, bounded.
  void settle(const char* op, const char* call) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t status = ncclCommGetAsyncError(comm_, &state);
      if (status != ncclSuccess) nccl(status, op, "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) nccl(state, op, call);
      const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
      if (waited.count() > wait_limit_) {
        fail(op, std::string(call) + " did not finish within " + std::to_string(wait_limit_) +
                     " s (RIFTCO_NCCL_WAIT_TIMEOUT): another rank did not take part");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void check_async(const char* op) {
    if (comm_ == nullptr) return;
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
      nccl(state, op, "a collective in flight (ncclCommGetAsyncError)");
    }
  }

  void nccl(ncclResult_t status, const char* op, const char* call) {
    if (status == ncclSuccess || status == ncclInProgress) return;
    const char* last = ncclGetLastError(comm_);
    fail(op, std::string(call) + " failed: " + ncclGetErrorString(status) +
                 (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string()));
  }

  void cuda(cudaError_t status, const char* op, const char* call) {
    if (status == cudaSuccess) return;
    cudaGetLastError();
    fail(op, std::string(call) + " failed: " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
  }

  /// Aborts the NCCL communicator (once) and throws: the ranks are out of step.
  [[noreturn]] void fail(const char* op, const std::string& what) {
    const std::string message = std::string("[") + op + "] " + what + " on rank " + std::to_string(rank_) + " of " +
                                std::to_string(size_) + " (nccl communicator, CUDA device " +
                                std::to_string(device_) + ")";
    if (broken_.empty()) broken_ = message;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw CommunicationError(message);
  }

  Communicator& host_;
  int rank_;
  int size_;
  double wait_limit_;
  int device_ = -1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::string broken_;  // why the communicator was aborted (empty: it was not)
};

DeviceRequest::~DeviceRequest() {
  if (finished_) return;
  if (cudaEventQuery(done_) == cudaSuccess) {
    finish();
    return;
  }
  // Abandoned while NCCL may still write: its scratch (and event) are kept.
  scratch_.release();
}

bool DeviceRequest::test() {
  if (finished_) return true;
  comm_.refuse_if_broken("all_reduce_sum");
  if (!comm_.poll(done_, "all_reduce_sum")) return false;
  finish();
  return true;
}

void DeviceRequest::wait() {
  if (finished_) return;
  comm_.refuse_if_broken("all_reduce_sum");
  comm_.wait_for(done_, "all_reduce_sum", elements_);
  finish();
}

void DeviceRequest::finish() {
  cudaEventDestroy(done_);
  scratch_ = Scratch();
  finished_ = true;
}

}  // namespace

Communicator& nccl_world() {
  // Never destroyed: it may be in use until exit, after CUDA's own teardown.
  static NcclCommunicator* const world = new NcclCommunicator(Communicator::world());
  return *world;
}

}  // namespace riftco_transformer::distributed_detail

namespace riftco_transformer {

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host) {
  return std::make_unique<distributed_detail::NcclCommunicator>(host);
}

}  // namespace riftco_transformer
