// Text as fp4lab's messages and records hold it: the one escaping rule (printable, and shown for an excerpt of a
// value), for every layer that echoes text it was given -- the golden model's knob parser, the readers, the command
// line and the Python module alike. Standard library only: its own library, fp4lab_text (models/CMakeLists.txt),
// that the golden model and fp4lab_io (which links no numerics) both link.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fp4lab {

// Whether s is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& s);

// Control bytes (< 0x20, 0x7F; NUL included, which would end a message read as a C string) and bytes that are not
// part of valid UTF-8 as \xNN; everything else as is. With keep_newlines, '\n' stays (for a whole table printed at
// once).
std::string printable(const std::string& s, bool keep_newlines = false);

// A value as an error message echoes it: its first 80 bytes through printable(), then "... (N bytes)" when there
// are more, so that a hostile value cannot make a message megabytes long.
std::string shown(const std::string& text);

// One argument as a POSIX shell reads it back: as is when it holds only safe characters, else single-quoted. The
// command lines outputs record (config.command), from the command line and from fp4lab.analyze alike.
std::string shell_quote(const std::string& s);

// The items of a comma-separated list, empty ones dropped ("e2m1,,e1m2," -> e2m1, e1m2): the lists of options such
// as fp4lab analyze --formats, from the command line and from fp4lab.analyze alike.
std::vector<std::string> split_list(const std::string& s);

}  // namespace fp4lab
