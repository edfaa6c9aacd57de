// What the coordinator does when the hang detector (hang_detector.h, docs/hang.md) diagnoses a stall: <out>/hang.json
// (and kHangKey in its store), the diagnosis on stderr, the Flight Recorder dumps (flight_recorder.h), then
// CoordinatorOptions::on_hang. Without the mutex: each call takes it to read the detector.
#pragma once

#include "coordinator/coordinator_state.h"
#include "coordinator/store/store_server.h"

namespace prism::coord {

class HangWatch {
 public:
  HangWatch(CoordinatorState& st, store::StoreServer& store) : st_(st), store_(store) {}
  // On the status tick.
  void Check();
  // <out>/flight_recorder/nccl_trace_rank_<R> for every real rank, and the virtual ranks' where they can be
  // derived; at a hang and at stop.
  void WriteFlightRecorder();

 private:
  CoordinatorState& st_;
  store::StoreServer& store_;
};

}  // namespace prism::coord
