// The pstrain subcommands. Each takes the process argv with argv[1] being its own name, parses
// its own flags (with --help), and returns the process exit code.
#pragma once

namespace pstrain {

int RunDatagen(int argc, char** argv);
int RunConvert(int argc, char** argv);
int RunTrain(int argc, char** argv);
int RunPs(int argc, char** argv);
int RunHost(int argc, char** argv);
int RunWorker(int argc, char** argv);
int RunLocal(int argc, char** argv);
int RunAllreduce(int argc, char** argv);
int RunTune(int argc, char** argv);
int RunConfig(int argc, char** argv);
int RunPredict(int argc, char** argv);
int RunExport(int argc, char** argv);
int RunServe(int argc, char** argv);

}  // namespace pstrain
