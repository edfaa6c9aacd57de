// chakra_import_bench: import-chakra of per-rank Chakra ETs, the streaming importer (ImportChakra) against the
// reference that keeps every rank's nodes (ImportChakraDocument, the code path before it), in the same run.
//
// The ETs are what `prism-run synth --tp 8 --pp 16 --dp D --microbatches 32 --tp-comm` then `prism-run
// export-chakra` write: D = 8 is the 1024-rank job, D = 64 the 8192-rank one (1F1B, per-layer tensor-parallel
// collectives). They are generated in a child process into a temporary directory (or --dir DIR, kept). Then,
// per size and --runs times, alternately: a fresh child process runs the reference import and writes the graph
// (.prism), another runs the streaming import and writes its graph; wall time from fork to exit, peak RSS from
// wait4. Why children: each import starts from a small process, as `prism-run import-chakra` does, and its peak
// is its own. The two graphs must be the same bytes. Then the real command, `prism-run import-chakra DIR -o OUT
// --quiet` (the prism-run next to this binary). Before each, the files are read once (page cache warm); disk_MB
// is what the three read from the disk all the same. Medians, and the median of per-run ratios (reference /
// streaming).
//
//   chakra_import_bench [--runs N] [--sizes 1024,8192] [--dir DIR] [--threads N] [--no-reference]
//
// --dir DIR keeps the ETs there (and reuses them when DIR/et<ranks>/ holds some); --threads is the streaming
// importer's (0: one per core, at most 4); --no-reference skips the reference (it takes ~30 s at 8192 ranks).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "replay/chakra/chakra_export.h"
#include "replay/chakra/chakra_import.h"
#include "replay/synth.h"
#include "replay/trace_io.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::string Str(int argc, char** argv, const char* name, const std::string& dflt = "") {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return dflt;
}
bool Flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return true;
  }
  return false;
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Child {
  double wall_s = 0, rss_mb = 0, disk_mb = 0;  // disk_mb: what it read from the disk, not the page cache
  bool ok = false;
};

// Runs `body` in a fresh child process: fork to exit, peak RSS from wait4. body's return is the exit status.
template <typename F>
Child InChild(F body) {
  Child c;
  std::fflush(stdout);
  auto t0 = Clock::now();
  pid_t pid = fork();
  if (pid < 0) return c;
  if (pid == 0) std::_Exit(body());
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  c.wall_s = Since(t0);
  c.rss_mb = ru.ru_maxrss / 1024.0;
  c.disk_mb = ru.ru_inblock * 512.0 / 1e6;
  c.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return c;
}

// Writes the ETs into dir unless they are there; *reused says which.
bool Generate(int dp, const fs::path& dir, bool* reused) {
  *reused = fs::exists(dir / "prism.0.et") && fs::exists(dir / "comm_group.json");
  if (*reused) return true;
  Child c = InChild([&] {
    prism::replay::SynthOptions o;
    o.tp = 8;
    o.pp = 16;
    o.dp = dp;
    o.microbatches = 32;
    o.tp_comm = true;
    prism::trace::Trace t;
    std::string err;
    if (!prism::replay::Synthesize(o, &t, &err)) {
      std::fprintf(stderr, "synth: %s\n", err.c_str());
      return 1;
    }
    prism::chakra::ExportOptions eo;
    eo.out_dir = dir.string();
    if (!prism::chakra::ExportChakra(t, eo, nullptr, &err)) {
      std::fprintf(stderr, "export: %s\n", err.c_str());
      return 1;
    }
    return 0;
  });
  return c.ok;
}

Child Import(const fs::path& et, const fs::path& out, bool reference, int threads) {
  return InChild([&] {
    prism::chakra::ImportOptions o;
    o.input = et.string();
    o.threads = threads;
    prism::trace::Trace t;
    prism::chakra::ImportSummary s;
    std::string err;
    const bool ok = reference ? prism::chakra::ImportChakraDocument(o, &t, &s, &err)
                              : prism::chakra::ImportChakra(o, &t, &s, &err);
    if (!ok || !prism::replay::WriteTrace(t, out.string(), &err)) {
      std::fprintf(stderr, "import: %s\n", err.c_str());
      return 1;
    }
    return 0;
  });
}

Child Command(const std::string& prism_run, const fs::path& et, const fs::path& out) {
  return InChild([&] {
    const std::string et_s = et.string(), out_s = out.string();
    execl(prism_run.c_str(), prism_run.c_str(), "import-chakra", et_s.c_str(), "-o", out_s.c_str(), "--quiet",
          static_cast<char*>(nullptr));
    return 127;
  });
}

// Reads every ET file once. Why before each import: this VM drops cold file pages (its 2.3 GB reference run, the
// other builds), and an import that reads its files from the disk measures the disk.
void WarmCache(const fs::path& dir) {
  std::vector<char> buf(1 << 20);
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".et") continue;
    std::ifstream in(e.path(), std::ios::binary);
    while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
    }
  }
}

uint64_t DirBytes(const fs::path& dir, size_t* files) {
  uint64_t bytes = 0;
  *files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".et") {
      bytes += e.file_size();
      ++*files;
    }
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = std::max(1, std::atoi(Str(argc, argv, "--runs", "5").c_str()));
  const int threads = std::atoi(Str(argc, argv, "--threads", "0").c_str());
  const bool reference = !Flag(argc, argv, "--no-reference");
  std::vector<int> sizes;
  {
    std::stringstream ss(Str(argc, argv, "--sizes", "1024,8192"));
    for (std::string x; std::getline(ss, x, ',');) sizes.push_back(std::atoi(x.c_str()));
  }
  const std::string keep = Str(argc, argv, "--dir");
  const fs::path root = keep.empty() ? fs::temp_directory_path() / ("chakra_import_bench." + std::to_string(getpid()))
                                     : fs::path(keep);
  const std::string prism_run = (fs::read_symlink("/proc/self/exe").parent_path() / "prism-run").string();
  fs::create_directories(root);
  bool all_same = true;
  for (int ranks : sizes) {
    if (ranks % 128 != 0 || ranks <= 0) {
      std::fprintf(stderr, "chakra_import_bench: --sizes takes multiples of 128 (tp 8 x pp 16 x dp)\n");
      return 2;
    }
    const int dp = ranks / 128;
    const fs::path et = root / ("et" + std::to_string(ranks));
    auto g0 = Clock::now();
    bool reused = false;
    if (!Generate(dp, et, &reused)) {
      std::fprintf(stderr, "chakra_import_bench: generating the %d-rank ETs failed\n", ranks);
      return 1;
    }
    size_t files = 0;
    const uint64_t bytes = DirBytes(et, &files);
    std::printf("%d ranks: synth --tp 8 --pp 16 --dp %d --microbatches 32 --tp-comm, export-chakra: %zu files, "
                "%.0f MB (%s, %s)\n",
                ranks, dp, files, bytes / 1e6, et.c_str(),
                reused ? "reused" : ("written in " + std::to_string(Since(g0)) + " s").c_str());
    std::printf("%4s %12s %10s %12s %10s %8s %12s %10s %8s\n", "run", "reference_s", "rss_MB", "streaming_s",
                "rss_MB", "ratio", "command_s", "rss_MB", "disk_MB");
    std::vector<double> ref_s, ref_mb, new_s, new_mb, ratio, cmd_s, cmd_mb;
    const fs::path ref_out = root / "ref.prism", new_out = root / "new.prism", cmd_out = root / "cmd.prism";
    for (int i = 0; i < runs; ++i) {
      Child r;
      double disk = 0;
      if (reference) {
        WarmCache(et);
        r = Import(et, ref_out, true, threads);
        disk += r.disk_mb;
        if (!r.ok) return 1;
        ref_s.push_back(r.wall_s);
        ref_mb.push_back(r.rss_mb);
      }
      WarmCache(et);
      Child n = Import(et, new_out, false, threads);
      WarmCache(et);
      Child c = Command(prism_run, et, cmd_out);
      disk += n.disk_mb + c.disk_mb;
      if (!n.ok || !c.ok) {
        std::fprintf(stderr, "chakra_import_bench: the streaming import or %s failed\n", prism_run.c_str());
        return 1;
      }
      new_s.push_back(n.wall_s);
      new_mb.push_back(n.rss_mb);
      cmd_s.push_back(c.wall_s);
      cmd_mb.push_back(c.rss_mb);
      if (reference) ratio.push_back(r.wall_s / n.wall_s);
      if (i == 0) {
        const std::string got = Slurp(new_out);
        const bool same = (!reference || got == Slurp(ref_out)) && got == Slurp(cmd_out);
        all_same = all_same && same;
        if (!same) std::printf("  the graphs differ\n");
      }
      std::printf("%4d %12.3f %10.1f %12.3f %10.1f %8.2f %12.3f %10.1f %8.1f\n", i, reference ? r.wall_s : 0.0,
                  reference ? r.rss_mb : 0.0, n.wall_s, n.rss_mb, reference ? r.wall_s / n.wall_s : 0.0, c.wall_s,
                  c.rss_mb, disk);
    }
    std::printf("median %d ranks: reference %.3f s (peak RSS %.1f MB), streaming %.3f s (peak RSS %.1f MB), ratio "
                "%.2f (median of per-run ratios); prism-run import-chakra %.3f s (peak RSS %.1f MB); same graph: "
                "%s\n\n",
                ranks, Median(ref_s), Median(ref_mb), Median(new_s), Median(new_mb), Median(ratio), Median(cmd_s),
                Median(cmd_mb), all_same ? "yes" : "NO");
  }
  if (keep.empty()) {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  return all_same ? 0 : 1;
}
