// A launcher of another MPI than the binary's starts N singletons (launch_check.h): the variable
// of the launcher that started the process is believed, and only when MPI sees one rank.

#include "meshtrain/app/launch_check.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace meshtrain {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ForeignLauncher, MpichBinaryUnderOpenMpiMpirun) {
  const std::string p = foreign_launcher_problem(1, Launcher::OpenMpi,
                                                 env_of({{"OMPI_COMM_WORLD_SIZE", "4"}}),
                                                 "MPICH 4.0.2");
  EXPECT_TRUE(contains(p, "Open MPI mpirun started 4 processes (OMPI_COMM_WORLD_SIZE=4)")) << p;
  EXPECT_TRUE(contains(p, "links MPICH 4.0.2")) << p;
  EXPECT_TRUE(contains(p, "mpiexec.mpich")) << p;
}

TEST(ForeignLauncher, OpenMpiBinaryUnderHydra) {
  const std::string p = foreign_launcher_problem(1, Launcher::Hydra, env_of({{"PMI_SIZE", "2"}}),
                                                 "Open MPI v4.1.4");
  EXPECT_TRUE(contains(p, "started 2 processes (PMI_SIZE=2)")) << p;
  EXPECT_TRUE(contains(p, "Open MPI's mpirun")) << p;
}

TEST(ForeignLauncher, SrunWithoutTheMpisPmiNamesTheFlag) {
  const auto env = env_of({{"SLURM_STEP_NUM_TASKS", "8"}});
  EXPECT_TRUE(contains(foreign_launcher_problem(1, Launcher::Slurm, env, "MPICH 4.0.2"),
                       "srun --mpi=pmi2"));
  EXPECT_TRUE(contains(foreign_launcher_problem(1, Launcher::Slurm, env, "Open MPI v4.1.4"),
                       "srun --mpi=pmix"));
}

TEST(ForeignLauncher, SilentWhenTheWorldIsWhatWasLaunched) {
  // The binary's own launcher: MPI's world holds every process.
  EXPECT_EQ(foreign_launcher_problem(4, Launcher::OpenMpi, env_of({{"OMPI_COMM_WORLD_SIZE", "4"}}),
                                     "Open MPI v4.1.4"), "");
  // One process asked for, or started by hand.
  EXPECT_EQ(foreign_launcher_problem(1, Launcher::OpenMpi, env_of({{"OMPI_COMM_WORLD_SIZE", "1"}}),
                                     "Open MPI v4.1.4"), "");
  EXPECT_EQ(foreign_launcher_problem(1, Launcher::Unknown, env_of({{"PMI_SIZE", "4"}}), "MPICH"),
            "");
  // mpirun inside an allocation: its ranks carry the srun step of its daemons (2 nodes), which
  // is not the launch of this process.
  EXPECT_EQ(foreign_launcher_problem(1, Launcher::OpenMpi,
                                     env_of({{"OMPI_COMM_WORLD_SIZE", "1"},
                                             {"SLURM_STEP_NUM_TASKS", "2"}}),
                                     "Open MPI v4.1.4"), "");
  // Not a number: not believed.
  EXPECT_EQ(foreign_launcher_problem(1, Launcher::Hydra, env_of({{"PMI_SIZE", "4x"}}), "MPICH"),
            "");
}

}  // namespace
}  // namespace meshtrain
