// The escaping rule every layer shares (fp4lab/text.hpp) and the output-path rules of the front-ends
// (fp4lab/io/outputs.hpp), with expected values written out by hand.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fp4lab/io/outputs.hpp"
#include "fp4lab/text.hpp"

namespace fs = std::filesystem;
using fp4lab::io::output_fault;
using fp4lab::printable;
using fp4lab::shell_quote;
using fp4lab::shown;
using fp4lab::valid_utf8;

TEST(Text, PrintableEscapesControlBytesAndBrokenUtf8) {
  EXPECT_EQ(printable("plain é ✓"), "plain é ✓");
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable("a\nb\x7f"), "a\\x0Ab\\x7F");
  EXPECT_EQ(printable("a\nb", /*keep_newlines=*/true), "a\nb");
  EXPECT_EQ(printable("\xC3"), "\\xC3");             // a sequence cut short
  EXPECT_EQ(printable("\xC0\xAF"), "\\xC0\\xAF");    // an overlong '/'
  EXPECT_EQ(printable("\xED\xA0\x80"), "\\xED\\xA0\\x80");  // a UTF-16 surrogate
}

// An excerpt of a value in a message: the same escaping, at most 80 bytes of the value, then its length. A
// character cut at byte 80 is escaped, not left as a broken sequence.
TEST(Text, ShownIsPrintableCutAt80Bytes) {
  EXPECT_EQ(shown("e1m2"), "e1m2");
  EXPECT_EQ(shown(std::string("a\0b\xFF", 4)), "a\\x00b\\xFF");
  EXPECT_EQ(shown(std::string(80, 'x')), std::string(80, 'x'));
  EXPECT_EQ(shown(std::string(81, 'x')), std::string(80, 'x') + "... (81 bytes)");
  EXPECT_EQ(shown(std::string(79, 'x') + "é"), std::string(79, 'x') + "\\xC3... (81 bytes)");
}

TEST(Text, ValidUtf8) {
  EXPECT_TRUE(valid_utf8(""));
  EXPECT_TRUE(valid_utf8("\xF0\x9F\x98\x80"));   // U+1F600
  EXPECT_FALSE(valid_utf8("\xF4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(valid_utf8("\xE0\x80\xAF"));      // overlong
  EXPECT_FALSE(valid_utf8("\xFF"));
}

TEST(Text, ShellQuoteReadsBackAsOneWord) {
  EXPECT_EQ(shell_quote("traces/step_1.safetensors"), "traces/step_1.safetensors");
  EXPECT_EQ(shell_quote("--rht=16"), "--rht=16");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
}

class OutputRules : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("fp4lab_text_test." + std::to_string(::getpid()));
    fs::create_directories(dir);
    in = (dir / "in.bin").string();
    std::ofstream(in) << "x";
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
  std::string in;
};

TEST_F(OutputRules, AFreshNameInAnExistingFolderPasses) {
  EXPECT_FALSE(output_fault({(dir / "out.json").string()}, {in}));
  EXPECT_FALSE(output_fault({in + ".out"}, {in}));
}

TEST_F(OutputRules, EachFaultIsOneLineWithItsKind) {
  auto f = output_fault({""}, {});
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->usage);
  EXPECT_EQ(f->message, "an output file name is empty");

  f = output_fault({in}, {in});
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->usage);
  EXPECT_EQ(f->message, in + ": output is also an input (" + in + "); it would be overwritten");

  // The same file spelt another way is still the input.
  const std::string other = (dir / "." / "in.bin").string();
  f = output_fault({other}, {in});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->message, other + ": output is also an input (" + in + "); it would be overwritten");

  const std::string out = (dir / "o.json").string();
  f = output_fault({out, out}, {});
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->usage);
  EXPECT_EQ(f->message, out + ": given as two outputs (" + out + ")");

  const std::string lost = (dir / "no" / "o.json").string();
  f = output_fault({lost}, {});
  ASSERT_TRUE(f);
  EXPECT_FALSE(f->usage);
  EXPECT_EQ(f->message, lost + ": no such folder " + (dir / "no").string());

  f = output_fault({dir.string()}, {});
  ASSERT_TRUE(f);
  EXPECT_FALSE(f->usage);
  EXPECT_EQ(f->message, dir.string() + ": output exists and is not a regular file (outputs are written to a "
                        "temporary file and renamed into place; use --json - for stdout)");

  f = output_fault({(dir / "..").string()}, {});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->message, (dir / "..").string() + ": output names a folder, not a file");

  // A control byte in a name is escaped in the message.
  const std::string odd = (dir / "no\x01" / "o").string();
  f = output_fault({odd}, {});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->message, (dir / "no\\x01" / "o").string() + ": no such folder " + (dir / "no\\x01").string());
}
