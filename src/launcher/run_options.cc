#include "launcher/run_options.h"

#include <cstdio>
#include <type_traits>

namespace prism::launcher {

namespace {

// An accessor of a StagedOptions field (OptionField): a lambda returning a reference to it.
#define PRISM_FIELD(expr) [](StagedOptions& s) -> decltype(auto) { return (expr); }

const OptionDef kEmulateOptions[] = {
    {.name = "--ranks", .value = "LIST", .field = PRISM_FIELD(s.emulate.ranks), .default_note = "`0`",
     .help = "logical ranks to run for real: \"0\", \"0,517\", \"0-7\"",
     .doc = "logical ranks of the target world to run for real: `0`, `0,517`, `0-7`, `0,4-7`. Each must be in the "
            "world, none twice."},
    {.name = "--node-rank", .value = "K", .field = PRISM_FIELD(s.emulate.node_rank), .lo = 0, .hi = 1e6,
     .default_note = "none",
     .help = "run every rank of this virtual node for real (instead of --ranks); with --ranks and --coordinator: "
             "this host's number among the hosts",
     .doc = "instead of `--ranks`: every rank of virtual node K (`K*nproc .. K*nproc+nproc-1`). Together with "
            "`--ranks` only when joining (`--coordinator`): then it numbers this host among the hosts (docs/hang.md, "
            "\"Two hosts\")."},
    {.name = "--layout", .value = "SPEC", .field = PRISM_FIELD(s.emulate.layout),
     .default_note = "the job's Megatron arguments",
     .help = "the job's parallel layout: \"tp=8,pp=4,dp=32[,cp=..,ep=..,etp=..][,order=tp-cp-ep-dp-pp]\"",
     .doc = "`tp=8,pp=4,dp=32[,cp=..,ep=..,etp=..,vpp=..,gtp=..,egtp=..,dist_opt=..,gloo=0/1]"
            "[,order=tp-cp-ep-dp-pp]`. `dp` may be left out (derived from the world size)."},
    {.name = "--gpus", .value = "N", .field = PRISM_FIELD(s.emulate.gpus), .lo = 1, .hi = 1e6,
     .default_note = "`CUDA_VISIBLE_DEVICES`, else `nvidia-smi -L`, else 1", .help = "GPUs of this host to use",
     .doc = "GPUs of this host to spread the real ranks over (round robin, in `--ranks` order). More real ranks than "
            "GPUs is allowed (functional and memory runs); the report warns that their timings share a GPU."},
    {.name = "--topology", .value = "NAME|FILE", .field = PRISM_FIELD(s.emulate.topology),
     .help = "target cluster: preset name or JSON file",
     .doc = "target cluster (presets in `examples/topologies/`), passed to libprism and the coordinator as "
            "`PRISM_TOPOLOGY` (a file by absolute path)"},
    {.name = "--policy", .value = "graph|mirror", .field = PRISM_FIELD(s.policy), .choices = "graph|mirror",
     .env = "PRISM_POLICY", .cli_reads_env = false,
     .default_note = "`graph` (`mirror` with `--coordinator`, `--listen` or `--remote-ranks`)",
     .help = "how virtual ranks answer: graph (collect, fill and emulate against the filled graph, kept in the "
             "graph cache) or mirror (quick, not faithful: a virtual peer arrives when its real counterpart does; "
             "no pipeline bubble, no stragglers)",
     .doc = "graph: the procedure above; mirror: one quick emulation, not faithful. A given `--graph` wins over "
            "`PRISM_POLICY`."},
    {.name = "--graph-cache", .value = "DIR", .field = PRISM_FIELD(s.cache_root), .env = "PRISM_GRAPH_CACHE",
     .default_note = "`$XDG_CACHE_HOME/prism/graphs`, else `~/.cache/prism/graphs`",
     .help = "where the default procedure keeps collect and fill results",
     .doc = "where the procedure keeps collect and fill results (above)"},
    {.name = "--refresh-graph", .field = PRISM_FIELD(s.refresh),
     .help = "collect and fill again even when the graph cache has this job"},
    {.name = "--fill-tolerance", .value = "PCT", .field = PRISM_FIELD(s.tolerance_pct), .lo = 0, .hi = 100,
     .help = "the fill stops when a round moves the estimate by at most this many percent"},
    {.name = "--fill-rounds", .value = "N", .field = PRISM_FIELD(s.max_rounds), .lo = 1, .hi = 100,
     .help = "at most this many fill rounds"},
    {.name = "--graph-iterations", .value = "K", .field = PRISM_FIELD(s.graph_iterations), .lo = 1, .hi = 100000,
     .help = "iterations of the job the collect and each fill slice run (--iterations, when given, wins)"},
    {.name = "--collect-swap", .value = "auto|on|off", .field = PRISM_FIELD(s.collect_swap),
     .choices = "auto|on|off",
     .help = "context switching in the collect stage: auto (again with it after a CUDA out-of-memory), on, off"},
    {.name = "--graph", .value = "FILE", .field = PRISM_FIELD(s.emulate.graph),
     .help = "replay virtual ranks from this PrismTrace (skips collect and fill)",
     .doc = "PrismTrace the virtual ranks replay from, skipping collect and fill (passed to the coordinator). After "
            "the run every real rank is compared with `simulate` of the graph, iteration by iteration (one `prism: "
            "rank R: emulated vs simulate(graph): ...` line each, `graph_comparison` in report.json; and a second "
            "line with the real ranks' compute scaled to what they measured in this run, `own_speed` "
            "{run_compute_per_iteration_s, graph_compute_per_iteration_s, compute_scale, median_error_pct, "
            "steady_*} per rank; docs/fill.md). The run ends with `prism: graph replay: N decisions from the graph "
            "(M on the real rank's own arrival, lockstep), B blocked, U unmatched; P prereleases predicted; C priced "
            "by the cost model` (operations among virtual ranks only, priced as simulate prices them: "
            "docs/coordinator.md)"},
    {.name = "--what-if", .value = "straggler=R:F", .field = PRISM_FIELD(s.emulate.what_if),
     .help = "with a graph (the default policy, or --graph): straggler=RANK:FACTOR slows that virtual rank's "
             "compute in the replay (',' joins several); the graph comparison after the run uses the same",
     .doc = "with a graph (the default policy, or `--graph`): virtual rank R's compute takes F times its graph "
            "duration in the coordinator's replay (repeatable; `,` joins several); the comparison simulates with "
            "the same. R must be virtual; `bw-scale=`/`topology=` are refused (use `--topology`). Exit 2 otherwise"},
    {.name = "--payload", .value = "P", .field = PRISM_FIELD(s.emulate.payload),
     .choices = "mirror|recorded|random|zeros", .default_note = "`recorded` (policy graph), else `mirror`",
     .help = "data of virtual members: mirror|recorded|random|zeros",
     .doc = "data of virtual members: `mirror`, `recorded`, `random`, `zeros` (docs/payload.md)"},
    {.name = "--payload-dir", .value = "DIR", .field = PRISM_FIELD(s.emulate.payload_dir),
     .help = "with --payload recorded: the output directory of `prism-run collect` whose payloads/rank<R>.bin the "
             "real ranks replay (each rank the file of its class)",
     .doc = "with `--payload recorded` (required there): the output directory of `prism-run collect`; each real "
            "rank replays its own `DIR/payloads/rank<R>.bin` when it ran in the collect, else that of a collected "
            "rank C of its class (same coordinates but dp), else that of the rank of data-parallel replica 0 with "
            "the same tp/pp/cp coordinates (for an expert-parallel rank collected without `--real-routing`: the "
            "ep-0 rank). A missing file is an error naming the collect command to run."},
    {.name = "--payload-max-bytes", .value = "SIZE", .field = PRISM_FIELD(s.emulate.payload_max_bytes),
     .default_note = "`4M`",
     .help = "replay (collect: record) only recorded payloads up to this size, e.g. 4M, 4194304 or 0 (all); larger "
             "ones follow mirror (docs/payload.md)",
     .doc = "recorded payloads larger than SIZE (e.g. `4M`, `65536`) are neither recorded (collect) nor replayed "
            "(emulate, fill): those operations follow mirror, so no emulated collective copies megabytes of "
            "activations from the file; `0`: no limit (docs/payload.md). Sent to libprism as "
            "`PRISM_PAYLOAD_MAX_BYTES` in bytes."},
    {.name = "--out", .value = "DIR", .field = PRISM_FIELD(s.emulate.out),
     .default_note = "`./prism-out/<YYYYmmdd-HHMMSS>`", .help = "report directory", .doc = "output directory"},
    {.name = "--dry-run", .field = PRISM_FIELD(s.emulate.dry_run), .help = "print the plan and run nothing"},
    {.name = "--json", .field = PRISM_FIELD(s.emulate.json), .help = "with --dry-run: the plan as JSON",
     .doc = "with `--dry-run`: the plan as JSON (below)"},
    {.name = "--coordinator", .value = "ADDR", .field = PRISM_FIELD(s.emulate.coordinator),
     .default_note = "start one here",
     .help = "join a running coordinator (multi-host): HOST:PORT of its store, or its coordinator.json",
     .doc = "join a coordinator that is already running instead of starting one: `HOST:PORT` of its store "
            "(prism-run reads the coordinator's document from that store: its TCP event bus port, real ranks, "
            "world size; a rank it runs as virtual is refused), or its `coordinator.json` (or the directory holding "
            "it)"},
    {.name = "--listen", .value = "ADDR", .field = PRISM_FIELD(s.emulate.listen),
     .help = "the coordinator started here serves other hosts: its store and a TCP event bus bind this address "
             "(0.0.0.0, or this host's address)",
     .doc = "the coordinator started here also serves other hosts: its store and a TCP event bus bind ADDR "
            "(`0.0.0.0` or this host's address); docs/hang.md, \"Two hosts\""},
    {.name = "--remote-ranks", .value = "LIST", .field = PRISM_FIELD(s.emulate.remote_ranks),
     .help = "real ranks that prism-runs on other hosts will run against the coordinator started here (they join "
             "with --coordinator HOST:PORT)"},
    {.name = "--iterations", .value = "K", .field = PRISM_FIELD(s.emulate.iterations), .lo = 0, .hi = 1e15,
     .default_note = "`0` (the job's own end)",
     .help = "stop the job once every real rank has completed K iterations (its iteration marks), as if it had "
             "ended there: the report, trace and graph hold at least those K (0: run the job to its end)",
     .doc = "stop the job once every real rank has completed K iterations (its iteration marks): SIGTERM to the "
            "workers, SIGKILL 20 s later; the run counts as finished (exit 0, report.json "
            "`stopped_after_iterations`), and report, trace and graph hold the K iterations (a rank that ended one "
            "more before the signal keeps it; the graph drops the iteration the signal cut). A rank that fails after "
            "the stop began counts as stopped. For production commands with `--train-iters 500000`; also `collect` "
            "and `record`"},
    {.name = "--hang-timeout", .value = "S", .field = PRISM_FIELD(s.emulate.hang_timeout), .lo = 0, .hi = 1e15,
     .env = "PRISM_HANG_TIMEOUT",
     .help = "seconds without progress of any real rank, while some wait, before the hang diagnosis "
             "(<out>/hang.json, printed); 0 turns it off",
     .doc = "seconds without progress of any real rank, while some wait, before the hang diagnosis (`hang.json`, "
            "printed, FR dumps); `0` turns it off. docs/hang.md"},
    {.name = "--on-hang", .value = "stop|wait", .field = PRISM_FIELD(s.emulate.on_hang), .choices = "stop|wait",
     .help = "after a hang diagnosis: stop the job (report written, exit 4) or wait (keep running)",
     .doc = "after a diagnosed hang: stop the job (report written with `status: hang`, exit 4) or let it run"},
    {.name = "--no-preload", .field = PRISM_FIELD(s.emulate.no_preload),
     .help = "do not LD_PRELOAD libprism.so (tests the launch only: the job's NCCL calls are not emulated)",
     .doc = "do not preload `libprism.so`: checks the launch itself (commands, environment, store, reports). The "
            "job's NCCL calls are then not emulated; the report says so."},
    {.name = "--quiet", .field = PRISM_FIELD(s.emulate.quiet),
     .help = "do not copy the workers' output to the terminal (it is still in <out>/logs)"},
    {.name = "--no-passthrough", .field = PRISM_FIELD(s.emulate.no_passthrough),
     .help = "never run a communicator on the real NCCL; by default one whose members are all real, each on its "
             "own GPU, does (real NCCL kernels, links and timing among them)",
     .doc = "never run a communicator on the real NCCL. By default a communicator whose members are all real, each "
            "on its own GPU (e.g. `--ranks 0,1 --gpus 2`, a tensor-parallel pair), runs on the real NCCL "
            "(docs/libprism.md, \"Passthrough\"); `--dry-run` says whether the real ranks sit on distinct GPUs."},
    {.name = "--kernels", .field = PRISM_FIELD(s.emulate.kernels),
     .help = "record every kernel, memcpy and memset of the real ranks with CUPTI (<out>/rank<R>.kernels.jsonl), "
             "merged into trace.json; `prism-run report kernels` compares runs (docs/kernels.md)",
     .doc = "record every kernel, memcpy and memset of the real ranks with CUPTI into `<out>/rank<R>.kernels.jsonl` "
            "and merge them into `trace.json` on the clock of the collectives (`PRISM_KERNELS=1`; docs/kernels.md). "
            "Without CUPTI the job runs on and the report says why."},
    {.name = "--kernels-nvtx", .field = PRISM_FIELD(s.emulate.kernels_nvtx),
     .help = "--kernels, and the NVTX ranges the job emits",
     .doc = "`--kernels`, and the NVTX ranges the job emits (`PRISM_KERNELS=nvtx`)"},
};

#undef PRISM_FIELD

std::string NumberText(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// "|" in a Markdown table cell ends the cell.
std::string Cell(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else out += c;
  }
  return out;
}

// The value StagedOptions{} holds for `def`, as text ("" when none).
std::string HeldDefault(const OptionDef& def) {
  StagedOptions defaults;
  return std::visit(
      [&defaults](auto field) -> std::string {
        const auto& v = field(defaults);
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) return v ? "on" : "";
        else if constexpr (std::is_same_v<T, std::string>) return v;
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) return "";
        else if constexpr (std::is_same_v<T, int>) return std::to_string(v);
        else if constexpr (std::is_same_v<T, double>) return NumberText(v);
        else return v ? std::to_string(*v) : "";
      },
      def.field);
}

}  // namespace

std::span<const OptionDef> EmulateOptionTable() { return kEmulateOptions; }

std::string DefaultText(const OptionDef& def) {
  if (!def.default_note.empty()) return std::string(def.default_note);
  const std::string held = HeldDefault(def);
  return held.empty() ? "" : "`" + held + "`";
}

std::string DefaultPlainText(const OptionDef& def) {
  std::string out;
  for (char c : DefaultText(def))
    if (c != '`') out += c;
  return out;
}

std::string OptionsMarkdown() {
  std::string md = "| option | default | what |\n|---|---|---|\n";
  for (const OptionDef& d : kEmulateOptions) {
    const std::string name = "`" + std::string(d.name) + (d.value.empty() ? "" : " " + std::string(d.value)) + "`";
    std::string def = DefaultText(d);
    if (!d.env.empty()) def += (def.empty() ? "" : " ") + std::string("(`") + std::string(d.env) + "`)";
    std::string what(d.doc.empty() ? d.help : d.doc);
    if (d.lo != d.hi) what += " (" + NumberText(d.lo) + ".." + NumberText(d.hi) + ")";
    md += "| " + Cell(name) + " | " + Cell(def) + " | " + Cell(what) + " |\n";
  }
  return md;
}

}  // namespace prism::launcher
