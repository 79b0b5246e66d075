// dump_config (config/config_dump.h): the effective configuration reads back as itself, and
// names every key of the deck schema, so a key added to the schema but not to the dump fails
// here rather than silently missing from checkpoints.
// device-independent: only parses and prints decks; nothing runs on a device.

#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>

#include "meshtrain/config/config_dump.h"
#include "meshtrain/config/deck.h"

namespace meshtrain {
namespace {

const std::vector<std::string> kOverrides = {
    "run.name=dumped",          "run.seed=99",          "run.comm_timeout=12.5",
    "model.layers=6",           "model.heads=2",        "model.tie_embeddings=false",
    "data.train=[\"a.bin\", \"b \\\"q\\\".bin\"]",       "data.val=\"none\"",
    "train.precision=\"fp64\"", "train.lr=3e-4",        "train.eps=1e-10",
    "train.optimizer=\"muon\"", "train.muon_ns_steps=4",
    // Keys dumped only when set (so that other runs' recorded configuration stays as it was).
    "train.eval_tasks=[\"tasks.jsonl\"]", "train.qk_clip_threshold=50.0",
    "parallel.dp=2",            "parallel.pp=2",        "parallel.schedule=\"gpipe\"",
    "parallel.partition=[2, 4]", "parallel.recompute=\"full\"",
    "checkpoint.resume=\"none\"", "checkpoint.io=\"independent\"", "checkpoint.async_nice=3"};

TEST(ConfigDump, ReadsBackAsItself) {
  for (const auto& overrides : {std::vector<std::string>{}, kOverrides}) {
    const Config c = parse_deck("deck.toml", "", overrides);
    const std::string dump = dump_config(c);
    const Config back = parse_deck("dump", dump);
    EXPECT_EQ(dump_config(back), dump) << dump;
  }
  const Config c = parse_deck("deck.toml", "", kOverrides);
  const std::string dump = dump_config(c);
  EXPECT_NE(dump.find("layers = 6\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("\nlr = 3e-04\n"), std::string::npos) << dump;  // shortest round-trip form
  EXPECT_NE(dump.find("train = [\"a.bin\", \"b \\\"q\\\".bin\"]\n"), std::string::npos) << dump;
  EXPECT_NE(dump.find("partition = [2, 4]\n"), std::string::npos) << dump;
  const Config back = parse_deck("dump", dump);
  EXPECT_EQ(back.run.comm_timeout, 12.5);
  EXPECT_EQ(back.train.lr, 3e-4);
  EXPECT_EQ(back.train.eps, 1e-10);
}

TEST(ConfigDump, NamesEveryKeyOfTheSchema) {
  const std::string dump = dump_config(parse_deck("deck.toml", "", kOverrides));
  const std::string reference = deck_reference_markdown();
  const std::regex section(R"(#### \[(\w+)\])"), key(R"(\| `(\w+)` \|)");
  std::string current;
  int keys = 0;
  std::istringstream lines(reference);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, section)) {
      current = m[1];
      EXPECT_NE(dump.find("[" + current + "]\n"), std::string::npos) << current;
    } else if (std::regex_search(line, m, key)) {
      const std::string k = m[1];
      const size_t at = dump.find("[" + current + "]\n");
      const size_t next = dump.find("\n[", at + 1);
      const std::string table = dump.substr(at, next == std::string::npos ? std::string::npos : next - at);
      EXPECT_NE(table.find("\n" + k + " = "), std::string::npos) << current << "." << k << " is not dumped";
      ++keys;
    }
  }
  EXPECT_GT(keys, 40);
}

}  // namespace
}  // namespace meshtrain
