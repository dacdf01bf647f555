// A standalone example of the stoker core without Python.
//
// The parent forks one worker. The worker collates a batch of 4 samples, each a float32 vector
// of 3 values, into one stacked float32[4, 3] array plus an int, encodes it straight into a
// shared-memory slot from its SlotPool and announces it. The parent's Supervisor maps the slot,
// the parent validates and decodes the batch in place, prints it, releases the slot and stops the
// worker. Returns 0 on success.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "stoker/channel.h"
#include "stoker/slot.h"
#include "stoker/slot_pool.h"
#include "stoker/supervisor.h"
#include "stoker/wire_decoder.h"
#include "stoker/wire_encoder.h"

namespace {

constexpr int kSamples = 4;
constexpr int64_t kFeatures = 3;
constexpr uint64_t kTask = 1;

// The worker: one batch, then wait for kStop.
int RunWorker(int sock) {
  stoker::SlotPool pool(sock, /*worker_id=*/0);
  // Per-sample data, as a dataset would return it: sample s is {s, s + 0.5, s + 0.25}.
  std::vector<std::vector<float>> samples(kSamples);
  for (int s = 0; s < kSamples; ++s) samples[s] = {s + 0.0f, s + 0.5f, s + 0.25f};
  const int64_t sample_shape[1] = {kFeatures};
  std::vector<stoker::ArraySource> sources;
  for (const auto& sample : samples) {
    sources.push_back({reinterpret_cast<const uint8_t*>(sample.data()), sample_shape, nullptr, 1});
  }
  const int64_t batch_shape[2] = {kSamples, kFeatures};

  stoker::WireEncoder enc;
  enc.AddContainer(stoker::NodeKind::kTuple, 2);
  stoker::Status st =
      enc.AddArray(stoker::DType::kFloat32, 0, batch_shape, 2, sources.data(), sources.size());
  if (!st.ok()) return 10;
  enc.AddInt(42);
  const uint64_t bytes = enc.Layout();

  stoker::WritableSlot slot;
  if (!pool.Acquire(bytes, &slot).ok()) return 11;
  if (!enc.Write(slot.payload, slot.capacity).ok()) {
    pool.Abandon(slot);
    return 12;
  }
  if (!pool.Publish(slot, bytes, kTask).ok()) return 13;

  stoker::Message m;
  while (stoker::ReceiveMessage(sock, &m).ok()) {
    if (m.type() == stoker::MessageType::kStop) return 0;
  }
  return 14;
}

int Fail(const char* what, const stoker::Status& st) {
  std::fprintf(stderr, "example: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  std::unique_ptr<stoker::Supervisor> sup;
  stoker::Status st = stoker::Supervisor::Create(&sup);
  if (!st.ok()) return Fail("creating the supervisor", st);
  int fds[2];
  st = stoker::MakeChannelPair(fds);
  if (!st.ok()) return Fail("creating a channel", st);

  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    close(fds[0]);
    for (int fd : sup->OwnedFds()) close(fd);
    _exit(RunWorker(fds[1]));
  }
  close(fds[1]);
  st = sup->AddWorker(0, fds[0], pid);
  if (!st.ok()) return Fail("adding the worker", st);

  int rc = 1;
  stoker::SupervisorEvent ev;
  for (int tries = 0; tries < 50; ++tries) {  // at most ~5 s
    st = sup->Wait(100, &ev);
    if (!st.ok()) return Fail("waiting", st);
    if (ev.kind != stoker::SupervisorEvent::Kind::kTimeout) break;
  }
  if (ev.kind == stoker::SupervisorEvent::Kind::kMessage &&
      ev.message.type() == stoker::MessageType::kBatch && ev.slot != nullptr) {
    auto* header = reinterpret_cast<stoker::SlotHeader*>(ev.slot->data());
    stoker::SlotWord word(header);
    if (!word.Lend(static_cast<uint32_t>(ev.message.header.b))) {
      std::fprintf(stderr, "example: the slot is not the announced generation\n");
    } else {
      stoker::DecodedBatch batch;
      st = stoker::DecodeBatch(ev.slot->data() + stoker::kSlotHeaderSize,
                               ev.slot->size() - stoker::kSlotHeaderSize, &batch);
      if (!st.ok()) return Fail("decoding", st);
      const stoker::DecodedNode& array = batch.nodes[1];
      const int64_t* shape = batch.shape(array);
      std::printf("batch %llu from worker %d (slot %llu, %llu bytes)\n",
                  static_cast<unsigned long long>(ev.message.header.task), ev.worker,
                  static_cast<unsigned long long>(ev.message.header.a),
                  static_cast<unsigned long long>(ev.message.header.c));
      std::printf("  array: %s, shape [%lld, %lld]\n", stoker::DTypeName(array.dtype),
                  static_cast<long long>(shape[0]), static_cast<long long>(shape[1]));
      for (int64_t r = 0; r < shape[0]; ++r) {
        std::printf("   ");
        for (int64_t c = 0; c < shape[1]; ++c) {
          float v;
          std::memcpy(&v, array.data + (r * shape[1] + c) * sizeof(float), sizeof(v));
          std::printf(" %6.2f", v);
        }
        std::printf("\n");
      }
      std::printf("  int: %lld\n", static_cast<long long>(batch.nodes[2].int_value));
      rc =
          (shape[0] == kSamples && shape[1] == kFeatures && batch.nodes[2].int_value == 42) ? 0 : 1;
      if (!word.Release(static_cast<uint32_t>(ev.message.header.b))) rc = 1;  // back to the worker
    }
  } else {
    std::fprintf(stderr, "example: no batch arrived\n");
  }

  stoker::MessageHeader stop;
  stop.type = static_cast<uint32_t>(stoker::MessageType::kStop);
  stoker::Status sent = sup->Send(0, stop, nullptr, 0);
  if (!sent.ok()) {
    std::fprintf(stderr, "example: could not stop the worker: %s\n", sent.ToString().c_str());
    rc = 1;
  }
  for (int tries = 0; tries < 50; ++tries) {
    if (!sup->Wait(100, &ev).ok() || ev.kind == stoker::SupervisorEvent::Kind::kDied) break;
  }
  if (ev.kind == stoker::SupervisorEvent::Kind::kDied) {
    std::printf("worker exited with code %d\n", ev.exit.exit_code);
    if (ev.exit.exit_code != 0) rc = 1;
  }
  sup.reset();
  int status = 0;
  waitpid(pid, &status, 0);
  return rc;
}
