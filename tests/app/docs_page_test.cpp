// Refusals and --help name the docs page that explains them (app/docs_page.h): the table sends
// real messages to their pages, and every page it or a footer names exists.

#include "meshtrain/app/docs_page.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace meshtrain {
namespace {

TEST(DocsPage, MessagesGoToTheirTopicsPage) {
  EXPECT_EQ(docs_page_for("input/gpt.toml: parallel.tp = 5 does not divide model.heads = 12 (tp "
                          "must be one of 1, 2, 3, 4, 6, 12)"),
            "docs/parallelism-and-schedules.md");
  EXPECT_EQ(docs_page_for("step_00000004.h5: model.heads = 4 in the checkpoint, but deck.toml "
                          "has model.heads = 2"),
            "docs/checkpoints.md");
  EXPECT_EQ(docs_page_for("data/a_train.bin: checksum mismatch: the token bytes at offsets 64 to "
                          "3304 hash to 0x1, the header (offset 32) says 0x2: the shard is corrupt"),
            "docs/data-and-interop.md");
  EXPECT_EQ(docs_page_for("deck.toml: parallel.ep = 3 does not divide model.moe_experts = 8"),
            "docs/mixtures-of-experts.md");
  EXPECT_EQ(docs_page_for("deck.toml:2: unknown key model.layer (did you mean model.layers?); "
                          "keys of [model] are layers, d_model, moe_experts, moe_top_k"),
            "docs/deck-reference.md");
  EXPECT_EQ(docs_page_for("rank 2 stopped answering"), "docs/troubleshooting.md");
  EXPECT_EQ(docs_page_for("rank 2 stopped answering", "docs/hardware.md"), "docs/hardware.md");
}

TEST(DocsPage, PointerLineIsNotCountedAsAnError) {
  // The catalogue counts "meshtrain: error:" to check that a message is printed once.
  const std::string line = docs_pointer_line("docs/checkpoints.md");
  EXPECT_EQ(line, "meshtrain: more in docs/checkpoints.md\n");
  EXPECT_EQ(line.find("error"), std::string::npos);
}

TEST(DocsPage, FootersNameThePagesOfEachCommand) {
  EXPECT_NE(docs_footer("prepare").find("docs/data-and-interop.md"), std::string::npos);
  EXPECT_NE(docs_footer("plan").find("docs/memory-and-planning.md"), std::string::npos);
  EXPECT_NE(docs_footer("").find("docs/troubleshooting.md"), std::string::npos);
}

TEST(DocsPage, EveryNamedPageExists) {
  const std::filesystem::path repo = MESHTRAIN_SOURCE_ROOT;
  const std::vector<std::string> pages = docs_pages_named();
  EXPECT_GE(pages.size(), 10u);
  for (const std::string& page : pages)
    EXPECT_TRUE(std::filesystem::is_regular_file(repo / page)) << page << " does not exist";
}

}  // namespace
}  // namespace meshtrain
