// torchrun command lines as users write them, parsed as torch/distributed/run.py would.
#include "launcher/torchrun_args.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>

namespace prism::launcher {
namespace {

std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

EnvLookup NoEnv() {
  return [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
}

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TorchrunArgs Parse(const std::string& line, const EnvLookup& env = NoEnv()) {
  std::string err;
  auto a = ParseTorchrun(Words(line), env, &err);
  EXPECT_TRUE(a) << line << "\n  error: " << err;
  return a ? *a : TorchrunArgs{};
}

std::string ParseError(const std::string& line, const EnvLookup& env = NoEnv()) {
  std::string err;
  auto a = ParseTorchrun(Words(line), env, &err);
  EXPECT_FALSE(a) << line;
  return err;
}

// The command of gpu-machine-findings.md (unmodified Megatron-LM on one GPU).
TEST(Torchrun, MegatronFindingsCommand) {
  std::string line =
      "torchrun --nproc-per-node 1 pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
      "--seq-length 256 --max-position-embeddings 256 --micro-batch-size 2 --global-batch-size 4 --train-iters 6 "
      "--log-interval 1 --eval-iters 1 --eval-interval 1000 --mock-data --tokenizer-type NullTokenizer "
      "--vocab-size 1024 --transformer-impl local --lr 1e-4 --bf16 --no-gradient-accumulation-fusion "
      "--disable-gloo-process-groups --no-persist-layer-norm --no-masked-softmax-fusion";
  TorchrunArgs a = Parse(line);
  EXPECT_EQ(a.launcher, (std::vector<std::string>{"torchrun"}));
  EXPECT_EQ(a.nproc_per_node, "1");
  EXPECT_EQ(a.min_nodes, 1);
  EXPECT_EQ(a.max_nodes, 1);
  EXPECT_EQ(a.script, "pretrain_gpt.py");
  std::vector<std::string> all = Words(line);
  EXPECT_EQ(a.script_args, std::vector<std::string>(all.begin() + 4, all.end()));  // untouched
  EXPECT_EQ(a.options, (std::vector<std::string>{"--nproc-per-node", "1"}));
}

TEST(Torchrun, MultiNodeMegatron) {
  TorchrunArgs a = Parse(
      "torchrun --nnodes 128 --nproc-per-node 8 --node-rank 3 --master-addr node0 --master-port 6000 "
      "pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2");
  EXPECT_EQ(a.max_nodes, 128);
  EXPECT_EQ(a.nproc_per_node, "8");
  EXPECT_EQ(a.node_rank, 3);
  EXPECT_EQ(a.master_addr, "node0");
  EXPECT_EQ(a.master_port, 6000);
  EXPECT_EQ(a.script_args.size(), 4u);
}

TEST(Torchrun, EqualsFormAndUnderscores) {
  TorchrunArgs a = Parse(
      "torchrun --nnodes=2 --nproc_per_node=4 --node_rank=1 --master_addr=10.0.0.1 --master_port=29400 "
      "--rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29400 --rdzv_id=job42 --rdzv_conf=timeout=900,join_timeout=60 "
      "--max_restarts=3 --monitor_interval=5 --start_method=fork --log_dir=/tmp/logs --redirects=3 --tee=1 "
      "--role=trainer --local_ranks_filter=0,1 --local_addr=10.0.0.2 train.py --epochs=3");
  EXPECT_EQ(a.max_nodes, 2);
  EXPECT_EQ(a.nproc_per_node, "4");
  EXPECT_EQ(a.node_rank, 1);
  EXPECT_EQ(a.rdzv_backend, "c10d");
  EXPECT_EQ(a.rdzv_endpoint, "10.0.0.1:29400");
  EXPECT_EQ(a.rdzv_id, "job42");
  EXPECT_EQ(a.rdzv_conf, "timeout=900,join_timeout=60");
  EXPECT_EQ(a.max_restarts, 3);
  EXPECT_DOUBLE_EQ(a.monitor_interval, 5);
  EXPECT_EQ(a.start_method, "fork");
  EXPECT_EQ(a.log_dir, "/tmp/logs");
  EXPECT_EQ(a.redirects, "3");
  EXPECT_EQ(a.tee, "1");
  EXPECT_EQ(a.role, "trainer");
  EXPECT_EQ(a.local_ranks_filter, "0,1");
  EXPECT_EQ(a.local_addr, "10.0.0.2");
  EXPECT_EQ(a.script, "train.py");
  EXPECT_EQ(a.script_args, (std::vector<std::string>{"--epochs=3"}));
}

TEST(Torchrun, ElasticRangeAndStandalone) {
  TorchrunArgs a = Parse("torchrun --standalone --nnodes 1:4 --nproc-per-node gpu train.py");
  EXPECT_TRUE(a.standalone);
  EXPECT_EQ(a.min_nodes, 1);
  EXPECT_EQ(a.max_nodes, 4);
  EXPECT_EQ(a.nproc_per_node, "gpu");
  EXPECT_NE(ParseError("torchrun --nnodes 4:1 train.py").find("MIN"), std::string::npos);
  EXPECT_NE(ParseError("torchrun --nnodes 1:2:3 train.py").find("--nnodes"), std::string::npos);
  EXPECT_NE(ParseError("torchrun --nnodes zero train.py").find("zero"), std::string::npos);
  EXPECT_NE(ParseError("torchrun --nnodes 0 train.py").find("--nnodes"), std::string::npos);
}

TEST(Torchrun, ModuleNoPythonRunPath) {
  TorchrunArgs a = Parse("torchrun --nproc-per-node 2 -m my.pkg.train --lr 3");
  EXPECT_TRUE(a.module);
  EXPECT_EQ(a.script, "my.pkg.train");
  EXPECT_EQ(a.script_args, (std::vector<std::string>{"--lr", "3"}));
  a = Parse("torchrun --module --nproc-per-node 2 my.pkg.train");
  EXPECT_TRUE(a.module);
  a = Parse("torchrun --no-python --nproc-per-node 2 ./train.sh -x");
  EXPECT_TRUE(a.no_python);
  EXPECT_EQ(a.script, "./train.sh");
  EXPECT_EQ(a.script_args, (std::vector<std::string>{"-x"}));
  a = Parse("torchrun --no_python bash run.sh");
  EXPECT_TRUE(a.no_python);
  a = Parse("torchrun --run-path /abs/train.py");
  EXPECT_TRUE(a.run_path);
  EXPECT_NE(ParseError("torchrun --no-python -m pkg.train").find("--no-python"), std::string::npos);
}

TEST(Torchrun, ScriptArgumentsAreNeverParsed) {
  // Options after the script belong to the script, even when they look like torchrun's.
  TorchrunArgs a = Parse("torchrun --nproc-per-node 8 train.py --nnodes 99 --nproc-per-node 1 -m --unknown");
  EXPECT_EQ(a.nproc_per_node, "8");
  EXPECT_EQ(a.max_nodes, 1);
  EXPECT_FALSE(a.module);
  EXPECT_EQ(a.script_args,
            (std::vector<std::string>{"--nnodes", "99", "--nproc-per-node", "1", "-m", "--unknown"}));
  // "--" ends torchrun's options.
  a = Parse("torchrun --nproc-per-node 2 -- -weird-script-name.py --x");
  EXPECT_EQ(a.script, "-weird-script-name.py");
  EXPECT_EQ(a.script_args, (std::vector<std::string>{"--x"}));
}

TEST(Torchrun, ShortOptions) {
  TorchrunArgs a = Parse("torchrun -r 3 -t 0:1,1:2 train.py");
  EXPECT_EQ(a.redirects, "3");
  EXPECT_EQ(a.tee, "0:1,1:2");
  a = Parse("torchrun -r3 -t=2 train.py");
  EXPECT_EQ(a.redirects, "3");
  EXPECT_EQ(a.tee, "2");
}

TEST(Torchrun, AbbreviationsAsArgparse) {
  // argparse's allow_abbrev: an unambiguous prefix of a long option is that option.
  TorchrunArgs a = Parse("torchrun --nproc 4 --nn 2 train.py");
  EXPECT_EQ(a.nproc_per_node, "4");
  EXPECT_EQ(a.max_nodes, 2);
  std::string err = ParseError("torchrun --n 4 train.py");
  EXPECT_NE(err.find("ambiguous"), std::string::npos) << err;
  EXPECT_NE(err.find("--nnodes"), std::string::npos) << err;
}

TEST(Torchrun, UnknownOptionsAreNamed) {
  std::string err = ParseError("torchrun --nproc-per-node 8 --gpus-per-node 8 --foo=1 train.py");
  EXPECT_NE(err.find("--gpus-per-node"), std::string::npos) << err;
  EXPECT_NE(err.find("--foo=1"), std::string::npos) << err;
  err = ParseError("torchrun --help");
  EXPECT_NE(err.find("--help"), std::string::npos) << err;
  // torch.distributed.launch's --use-env is not a torchrun option.
  err = ParseError("torchrun --use-env train.py");
  EXPECT_NE(err.find("--use-env"), std::string::npos) << err;
}

TEST(Torchrun, BadValuesAreNamed) {
  EXPECT_NE(ParseError("torchrun --master-port http train.py").find("--master-port"), std::string::npos);
  EXPECT_NE(ParseError("torchrun --max-restarts -1 train.py").find("--max-restarts"), std::string::npos);
  EXPECT_NE(ParseError("torchrun --start-method thread train.py").find("spawn"), std::string::npos);
  EXPECT_NE(ParseError("torchrun --nproc-per-node").find("expects a value"), std::string::npos);
  EXPECT_NE(ParseError("torchrun --nproc-per-node 2").find("no training script"), std::string::npos);
  EXPECT_NE(ParseError("torchrun --standalone=1 train.py").find("no value"), std::string::npos);
}

TEST(Torchrun, PythonModuleLaunchers) {
  TorchrunArgs a = Parse("python -m torch.distributed.run --nproc_per_node=2 train.py");
  EXPECT_EQ(a.python, "python");
  EXPECT_EQ(a.launcher, (std::vector<std::string>{"python", "-m", "torch.distributed.run"}));
  EXPECT_EQ(a.nproc_per_node, "2");
  a = Parse("/opt/venv/bin/python3.11 -u -m torch.distributed.run --nnodes 2 train.py");
  EXPECT_EQ(a.python, "/opt/venv/bin/python3.11");
  EXPECT_EQ(a.max_nodes, 2);
  a = Parse("python3 -mtorch.distributed.run train.py");
  EXPECT_EQ(a.script, "train.py");
  a = Parse("/usr/local/bin/torchrun --nproc-per-node 2 train.py");
  EXPECT_EQ(a.launcher.front(), "/usr/local/bin/torchrun");

  // torch.distributed.launch: --use-env exists; without it the worker gets --local-rank=N.
  a = Parse("python -m torch.distributed.launch --nproc_per_node=8 --use_env train.py");
  EXPECT_TRUE(a.legacy_launch);
  EXPECT_TRUE(a.use_env);
  a = Parse("python -m torch.distributed.launch --nproc_per_node=8 train.py");
  EXPECT_FALSE(a.use_env);
  EXPECT_NE(ParseError("python -m torch.distributed.launch --no-python ./a.sh").find("--use-env"), std::string::npos);

  EXPECT_NE(ParseError("python train.py").find("torch.distributed.run"), std::string::npos);
  EXPECT_NE(ParseError("python -m pip install x").find("pip"), std::string::npos);
  EXPECT_NE(ParseError("mpirun -np 8 train.py").find("mpirun"), std::string::npos);
  EXPECT_NE(ParseError("").find("no command"), std::string::npos);
  EXPECT_TRUE(LooksLikeTorchrun(Words("torchrun x.py")));
  EXPECT_FALSE(LooksLikeTorchrun(Words("deepspeed x.py")));
}

TEST(Torchrun, PetEnvironmentDefaults) {
  // torchrun's env/check_env actions: PET_<DEST> gives the default, the command line wins.
  TorchrunArgs a = Parse("torchrun train.py", Env({{"PET_NNODES", "16"}, {"PET_NPROC_PER_NODE", "8"},
                                                  {"PET_NODE_RANK", "5"}, {"PET_STANDALONE", "1"}}));
  EXPECT_EQ(a.max_nodes, 16);
  EXPECT_EQ(a.nproc_per_node, "8");
  EXPECT_EQ(a.node_rank, 5);
  EXPECT_TRUE(a.standalone);
  EXPECT_EQ(a.from_env.size(), 4u);
  a = Parse("torchrun --nnodes 2 train.py", Env({{"PET_NNODES", "16"}}));
  EXPECT_EQ(a.max_nodes, 2);
  a = Parse("torchrun train.py", Env({{"PET_MODULE", "0"}}));
  EXPECT_FALSE(a.module);
  EXPECT_NE(ParseError("torchrun train.py", Env({{"PET_NNODES", "x"}})).find("PET_NNODES"), std::string::npos);
  EXPECT_NE(ParseError("torchrun train.py", Env({{"PET_STANDALONE", "yes"}})).find("PET_STANDALONE"),
            std::string::npos);
}

TEST(Torchrun, NegativeNumbersAreValues) {
  // argparse treats "-1" as a value (the parser has no option that looks like a number).
  TorchrunArgs a = Parse("torchrun --rdzv-id -1 train.py -5");
  EXPECT_EQ(a.rdzv_id, "-1");
  EXPECT_EQ(a.script_args, (std::vector<std::string>{"-5"}));
}

TEST(Torchrun, ResolveNproc) {
  std::string err;
  EXPECT_EQ(*ResolveNprocPerNode("8", 1, 16, &err), 8);
  EXPECT_EQ(*ResolveNprocPerNode("gpu", 4, 16, &err), 4);
  EXPECT_EQ(*ResolveNprocPerNode("auto", 2, 16, &err), 2);
  EXPECT_EQ(*ResolveNprocPerNode("auto", 0, 16, &err), 16);
  EXPECT_EQ(*ResolveNprocPerNode("cpu", 4, 16, &err), 16);
  EXPECT_FALSE(ResolveNprocPerNode("gpu", 0, 16, &err));
  EXPECT_FALSE(ResolveNprocPerNode("xpu", 4, 16, &err));
  EXPECT_NE(err.find("xpu"), std::string::npos);
  EXPECT_FALSE(ResolveNprocPerNode("0", 4, 16, &err));
}

}  // namespace
}  // namespace prism::launcher
