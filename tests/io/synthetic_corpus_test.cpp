// The synthetic corpus: a pure function of (seed, bytes), exactly the requested length, plain
// text, a limited vocabulary, and the long-range structure the header promises.

#include "meshtrain/io/synthetic_corpus.h"

#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>

namespace meshtrain {
namespace {

TEST(SyntheticCorpus, DeterministicForASeed) {
  EXPECT_EQ(synthetic_text(7, 100000), synthetic_text(7, 100000));
}

TEST(SyntheticCorpus, OtherSeedsGiveOtherText) {
  const std::string a = synthetic_text(7, 100000), b = synthetic_text(8, 100000);
  EXPECT_NE(a, b);
  EXPECT_NE(a.substr(0, 200), b.substr(0, 200));
}

TEST(SyntheticCorpus, ExactLengthAndPrefixOfLongerText) {
  const std::string longer = synthetic_text(3, 50000);
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{63}, size_t{12345}, size_t{50000}}) {
    const std::string t = synthetic_text(3, n);
    EXPECT_EQ(t.size(), n);
    EXPECT_EQ(t, longer.substr(0, n)) << n;
  }
}

TEST(SyntheticCorpus, OnlyPrintableAsciiAndNewlines) {
  const std::string t = synthetic_text(11, 1 << 20);
  for (size_t i = 0; i < t.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    ASSERT_TRUE(c == '\n' || (c >= 0x20 && c <= 0x7E)) << "byte " << int(c) << " at " << i;
  }
}

TEST(SyntheticCorpus, HasParagraphsAndALimitedVocabulary) {
  const std::string t = synthetic_text(5, 1 << 20);
  std::set<std::string> words;
  std::string w;
  size_t paragraphs = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      w += static_cast<char>(c | 0x20);
    } else {
      if (!w.empty()) words.insert(w);
      w.clear();
    }
    if (c == '\n' && i > 0 && t[i - 1] == '\n') ++paragraphs;
  }
  // A few hundred words: a byte-level model can learn them all. Thousands would mean the
  // grammar leaks something it should not (e.g. unbounded numbers).
  EXPECT_GT(words.size(), 200u);
  EXPECT_LT(words.size(), 600u);
  EXPECT_GT(paragraphs, 1000u);
}

TEST(SyntheticCorpus, SubjectsAgreeWithVerbs) {
  const std::string t = synthetic_text(2, 1 << 20);
  // Present-tense descriptions of "The dog ..." / "The dogs ...": the form of "be" follows.
  EXPECT_EQ(t.find("The dogs is"), std::string::npos);
  EXPECT_EQ(t.find("The dog are"), std::string::npos);
  EXPECT_NE(t.find("The dogs are"), std::string::npos);
  EXPECT_NE(t.find("The dog is"), std::string::npos);
  EXPECT_EQ(t.find("I have one balls"), std::string::npos);
  EXPECT_EQ(t.find(" a apple"), std::string::npos);
  EXPECT_EQ(t.find(" A apple"), std::string::npos);
}

// The long-range promises of the header, checked on every occurrence.
TEST(SyntheticCorpus, ReferencesInsideParagraphsHold) {
  const std::string t = synthetic_text(9, 1 << 20);
  std::istringstream paragraphs(t);
  std::string line, para;
  int stories = 0, gifts = 0, lists = 0;
  const std::regex intro("named ([A-Z][a-z]+)\\. (He|She) lived in ([A-Z][a-z]+),");
  const std::regex gift(
      "had ([a-z]+) ([a-z]+)\\. (?:He|She) gave one to [A-Z][a-z]+, so "
      "(?:he|she) had ([a-z]+) ");
  const char* numbers[] = {"zero",  "one",   "two",  "three", "four",   "five",  "six",
                           "seven", "eight", "nine", "ten",   "eleven", "twelve"};
  auto value = [&](const std::string& word) {
    for (int i = 0; i <= 12; ++i)
      if (word == numbers[i]) return i;
    return -1;
  };
  // Paragraphs are separated by blank lines; the last one may be cut short.
  size_t start = 0;
  while (true) {
    const size_t end = t.find("\n\n", start);
    if (end == std::string::npos) break;
    para = t.substr(start, end - start);
    start = end + 2;
    std::smatch m;
    if (std::regex_search(para, m, intro)) {
      ++stories;
      const std::string name = m[1], town = m[3];
      // The ending names the character and the home town again.
      const bool ends_home = para.find(name + " never left " + town) != std::string::npos ||
                             para.find(name + " went back to " + town) != std::string::npos ||
                             para.find("story of " + name + " from " + town) != std::string::npos;
      EXPECT_TRUE(ends_home) << para;
    }
    if (std::regex_search(para, m, gift)) {
      ++gifts;
      EXPECT_EQ(value(m[3]), value(m[1]) - 1) << para;
    }
    if (para.find("made a list of things") != std::string::npos) {
      ++lists;
      int items = 0;
      std::istringstream ls(para);
      while (std::getline(ls, line)) {
        if (!line.empty() && line[0] >= '1' && line[0] <= '9') {
          EXPECT_EQ(std::stoi(line), ++items) << para;
        }
      }
      EXPECT_NE(para.find(std::string("That is ") + numbers[items] + " things"), std::string::npos)
          << para;
    }
  }
  EXPECT_GT(stories, 100);
  EXPECT_GT(gifts, 20);
  EXPECT_GT(lists, 50);
}

}  // namespace
}  // namespace meshtrain
