// libFuzzer target: what a launcher reads from its environment and small files, all of it
// written by someone else (docs/PS.md "The cluster spec", docs/DEPLOY.md "SageMaker"):
//   - TF_CONFIG (cmd/cluster_spec.h ParseTfConfig, and through ResolveClusterSpec,
//     PsTaskFromEnvironment, WorkerTaskFromEnvironment with SM_HOSTS / SM_CURRENT_HOST,
//     SageMaker's resourceconfig.json and mpirun's OMPI_* beside it, and a --cluster value);
//   - SageMaker's JSON files (cmd/sagemaker.h): hyperparameters.json (ParseHyperparameters), and
//     the whole /opt/ml tree as ReadSageMakerContract reads it (resourceconfig.json,
//     inputdataconfig.json, hyperparameters.json, SM_HOSTS) under PSTRAIN_SAGEMAKER_ROOT;
//   - the cluster secret file and PSTRAIN_CLUSTER_SECRET (common/rpc/security.h ReadSecretFile,
//     cmd/cluster_security.h ClusterSecurity: the secret validated, a non-loopback bind);
//   - an input manifest (worker/data/file_list.h ParseManifest, and ExpandPath of a .manifest
//     file, whose keys name files relative to it).
// Input: length-prefixed pieces (fuzz/fuzz_util.h InputReader), in order: TF_CONFIG, SM_HOSTS,
// SM_CURRENT_HOST, resourceconfig.json, the --cluster value, an index byte, OMPI rank and size,
// hyperparameters.json, inputdataconfig.json, the secret file, PSTRAIN_CLUSTER_SECRET, a manifest.
// Seed corpus: fuzz/corpus/cluster_env/ (the documented examples, by make_fuzz_corpus.sh).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "cmd/cluster_security.h"
#include "cmd/cluster_spec.h"
#include "cmd/sagemaker.h"
#include "common/rpc/security.h"
#include "fuzz/fuzz_util.h"
#include "worker/data/file_list.h"

namespace {

// Sets (or, for an empty value, unsets) an environment variable the SageMaker reader looks at;
// a value with a NUL byte is cut there, as the environment would.
void SetEnv(const char* name, const std::string& value) {
  if (value.empty()) {
    unsetenv(name);
  } else {
    setenv(name, value.c_str(), 1);
  }
}

// Writes `path` with `bytes`, or removes it when they are empty (a file SageMaker did not write).
void WriteOrRemove(const std::string& path, const std::string& bytes) {
  if (bytes.empty()) {
    unlink(path.c_str());
  } else {
    pstrain::fuzz::WriteFile(path, bytes);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  static const std::string root = fuzz::ScratchDir("cluster_env");
  static const std::string config_dir = root + "/opt/ml/input/config";
  static const bool made = MakeDirs(config_dir).ok() && MakeDirs(root + "/data").ok();
  if (!made) return 0;
  fuzz::InputReader in(data, size);
  const std::string tf_config = in.Piece(), sm_hosts = in.Piece(), sm_current = in.Piece(),
                    resource = in.Piece(), cluster = in.Piece();
  const int index = in.Byte() % 8 - 1;
  const std::string rank = in.Piece(32), world = in.Piece(32);

  // TF_CONFIG and the cluster spec.
  (void)ParseTfConfig(tf_config);
  std::map<std::string, std::string> env;
  const std::pair<const char*, const std::string*> vars[] = {
      {"TF_CONFIG", &tf_config}, {"SM_HOSTS", &sm_hosts}, {"SM_CURRENT_HOST", &sm_current},
      {kSageMakerResourceConfig, &resource}, {"OMPI_COMM_WORLD_RANK", &rank},
      {"OMPI_COMM_WORLD_SIZE", &world}};
  for (const auto& [name, value] : vars) {
    if (!value->empty()) env[name] = *value;
  }
  (void)ResolveClusterSpec(cluster, index, env);
  (void)PsTaskFromEnvironment(env);
  (void)WorkerTaskFromEnvironment(env);

  // SageMaker's files, parsed alone and as the contract reader finds them.
  const std::string hyper = in.Piece(), input_config = in.Piece();
  SageMakerContract contract;
  (void)ParseHyperparameters(hyper, "hyperparameters.json", &contract);
  WriteOrRemove(config_dir + "/resourceconfig.json", resource);
  WriteOrRemove(config_dir + "/inputdataconfig.json", input_config);
  WriteOrRemove(config_dir + "/hyperparameters.json", hyper);
  setenv("PSTRAIN_SAGEMAKER_ROOT", root.c_str(), 1);
  SetEnv("SM_HOSTS", sm_hosts);
  (void)ReadSageMakerContract();
  unsetenv("SM_HOSTS");

  // The cluster secret, from a file (mode 600) and from the environment's map.
  const std::string secret = in.Piece(), secret_env = in.Piece();
  const std::string secret_file = root + "/secret";
  fuzz::WriteFile(secret_file, secret);
  chmod(secret_file.c_str(), 0600);
  (void)ReadSecretFile(secret_file);
  Config config;
  config.mutable_cluster()->set_secret_file(secret_file);
  (void)ClusterSecurity(config, {}, "0.0.0.0", 1 << 20);
  config.mutable_cluster()->clear_secret_file();
  std::map<std::string, std::string> secret_vars;
  if (!secret_env.empty()) secret_vars[kSecretEnvVariable] = secret_env;
  (void)ClusterSecurity(config, secret_vars, "0.0.0.0", 1 << 20);

  // An input manifest: parsed, and expanded as a .manifest file (keys relative to its directory).
  const std::string manifest = in.Rest();
  std::string prefix;
  std::vector<std::string> keys;
  (void)ParseManifest(manifest, "fuzz.manifest", &prefix, &keys);
  fuzz::WriteFile(root + "/data/input.manifest", manifest);
  (void)ExpandPath(root + "/data/input.manifest");
  return 0;
}
