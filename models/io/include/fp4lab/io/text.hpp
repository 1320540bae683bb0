// Text as fp4lab's messages and records hold it, for every front-end (the command line, fp4lab._core). No
// dependencies beyond the standard library, so the readers' fuzz targets (tests/sim/fuzz_readers.cpp) compile it
// alone.
#pragma once

#include <string>

namespace fp4lab::io {

// Control bytes (< 0x20, 0x7F) and bytes that are not part of valid UTF-8 as \xNN; everything else as is. With
// keep_newlines, '\n' stays (for a whole table printed at once).
std::string printable(const std::string& s, bool keep_newlines = false);

// Whether s is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& s);

// One argument as a POSIX shell reads it back: as is when it holds only safe characters, else single-quoted. The
// command lines outputs record (config.command), from the command line and from fp4lab.analyze alike.
std::string shell_quote(const std::string& s);

}  // namespace fp4lab::io
