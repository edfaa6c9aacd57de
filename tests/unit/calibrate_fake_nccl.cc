// A fake NCCL for calibrate_measure_test: communicators from ncclCommInitAll whose collectives and send/receive
// rendezvous across the calling threads like the real ones (a collective returns when every rank called it; a send
// when its receive was posted), and a log of every call (FAKE_NCCL_LOG: "op rank nranks count peer" per line).
// ncclCommInitAll fails unless NCCL_NVLS_ENABLE=0 and NCCL_NVLINK_SHARP_ENABLE=0 (the measurer must set them).
#include <nccl.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

struct ncclComm {
  int rank = 0, nranks = 0, id = 0;
};

namespace {

std::mutex g_mu;
std::condition_variable g_cv;
// Rendezvous points: (comm id, key) -> arrivals in the current generation.
struct Point {
  int arrived = 0;
  long generation = 0;
};
std::map<std::tuple<int, int, int>, Point> g_points;
int g_next_id = 0;

void Rendezvous(std::tuple<int, int, int> key, int parties) {
  std::unique_lock<std::mutex> lock(g_mu);
  Point& p = g_points[key];
  long gen = p.generation;
  if (++p.arrived == parties) {
    p.arrived = 0;
    ++p.generation;
    g_cv.notify_all();
    return;
  }
  g_cv.wait(lock, [&] { return g_points[key].generation != gen; });
}

void Log(const char* op, const ncclComm* c, size_t count, int peer) {
  const char* path = std::getenv("FAKE_NCCL_LOG");
  if (!path) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s %d %d %zu %d\n", op, c->rank, c->nranks, count, peer);
    std::fclose(f);
  }
}

ncclResult_t Coll(const char* op, ncclComm_t c, size_t count) {
  Log(op, c, count, -1);
  Rendezvous({c->id, -1, -1}, c->nranks);
  return ncclSuccess;
}

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* v) {
  *v = 22809;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t) { return "fake NCCL error"; }
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int*) {
  if (!EnvIs("NCCL_NVLS_ENABLE", "0") || !EnvIs("NCCL_NVLINK_SHARP_ENABLE", "0")) return ncclInvalidUsage;
  std::lock_guard<std::mutex> lock(g_mu);
  int id = g_next_id++;
  for (int i = 0; i < ndev; ++i) comms[i] = new ncclComm{i, ndev, id};
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
  delete c;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void*, void*, size_t count, ncclDataType_t, ncclRedOp_t, ncclComm_t c, cudaStream_t) {
  return Coll("allreduce", c, count);
}
ncclResult_t ncclAllGather(const void*, void*, size_t count, ncclDataType_t, ncclComm_t c, cudaStream_t) {
  return Coll("allgather", c, count);
}
ncclResult_t ncclReduceScatter(const void*, void*, size_t count, ncclDataType_t, ncclRedOp_t, ncclComm_t c,
                               cudaStream_t) {
  return Coll("reducescatter", c, count);
}
ncclResult_t ncclBroadcast(const void*, void*, size_t count, ncclDataType_t, int, ncclComm_t c, cudaStream_t) {
  return Coll("broadcast", c, count);
}
ncclResult_t ncclAlltoAll(const void*, void*, size_t count, ncclDataType_t, ncclComm_t c, cudaStream_t) {
  return Coll("alltoall", c, count);
}
ncclResult_t ncclSend(const void*, size_t count, ncclDataType_t, int peer, ncclComm_t c, cudaStream_t) {
  Log("send", c, count, peer);
  Rendezvous({c->id, c->rank, peer}, 2);
  return ncclSuccess;
}
ncclResult_t ncclRecv(void*, size_t count, ncclDataType_t, int peer, ncclComm_t c, cudaStream_t) {
  Log("recv", c, count, peer);
  Rendezvous({c->id, peer, c->rank}, 2);
  return ncclSuccess;
}
ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

}  // extern "C"
