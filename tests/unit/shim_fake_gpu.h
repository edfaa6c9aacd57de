// A fake of libprism's GPU boundary (src/interpose/core/gpu.h) for CPU tests: arrivals are stamped at once with
// the host clock, gates and payload steps are recorded, gate words live in plain memory.
#pragma once

#include <cstring>
#include <mutex>
#include <vector>

#include "interpose/core/gpu.h"

namespace prism::interpose::testing {

class FakeGpu : public Gpu {
 public:
  struct GateCall {
    uint32_t slot, ticket;
    GateKind kind;
    int ctas;
  };
  bool EnsureReady() override { return ready; }
  volatile uint64_t* ArrivalWord(uint32_t slot) override { return &arrival[slot % kGateSlots]; }
  volatile uint32_t* GateWord(uint32_t slot) override { return &gate[slot % kGateSlots]; }
  volatile uint64_t* IterWord(uint32_t slot) override { return &iter[slot % kIterSlots]; }
  ClockCalibration Calibration() const override { return ClockCalibration{0, 0, 0}; }
  CUresult Stamp(CUstream, uint32_t slot) override {
    if (!stamp_arrivals) return CUDA_SUCCESS;
    arrival[slot % kGateSlots] = HostNowNs();
    return CUDA_SUCCESS;
  }
  CUresult StampAndStep(CUstream s, uint32_t slot, const payload::OpDesc& d, const payload::Step& st) override {
    Stamp(s, slot);
    return RunStep(s, d, st);
  }
  int64_t SpinReleaseNs(int) override { return 0; }
  void MaybeRecalibrate() override {}
  CUresult Gate(CUstream, uint32_t slot, uint32_t ticket, GateKind kind, int ctas) override {
    std::lock_guard<std::mutex> l(mu);
    gates.push_back({slot, ticket, kind, ctas});
    return CUDA_SUCCESS;
  }
  CUresult RunStep(CUstream, const payload::OpDesc& d, const payload::Step& s) override {
    std::lock_guard<std::mutex> l(mu);
    steps.push_back(s);
    descs.push_back(d);
    return CUDA_SUCCESS;
  }
  CUresult StampIteration(CUstream, uint32_t slot) override {
    iter[slot % kIterSlots] = HostNowNs();
    return CUDA_SUCCESS;
  }
  CUresult CopyAsync(CUstream, uint64_t dst, uint64_t src, uint64_t bytes) override {
    std::lock_guard<std::mutex> l(mu);
    copies.push_back({dst, src, bytes});
    if (bytes) std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
    return CUDA_SUCCESS;
  }
  CUresult Synchronize(CUstream) override { return CUDA_SUCCESS; }
  uint8_t* HostStaging(size_t bytes) override {
    thread_local std::vector<uint8_t> staging;
    if (staging.size() < bytes) staging.resize(bytes);
    return staging.data();
  }
  bool Capturing(CUstream) override { return false; }
  void EnsureContext() override {}

  bool ready = true;
  bool stamp_arrivals = true;
  std::mutex mu;
  std::vector<GateCall> gates;
  std::vector<payload::Step> steps;
  std::vector<payload::OpDesc> descs;
  struct Copy {
    uint64_t dst, src, bytes;
  };
  std::vector<Copy> copies;  // CopyAsync calls (host pointers in tests: the copy is done at once)
  uint64_t arrival[kGateSlots] = {};
  uint32_t gate[kGateSlots] = {};
  uint64_t iter[kIterSlots] = {};
};

}  // namespace prism::interpose::testing
