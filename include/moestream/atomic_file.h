// atomic_file.h — "write FILE atomically" for every writer of an output file (`synth -o`,
// `run --route-trace`, `eval --save-ref`): the data goes to a temporary file next to FILE
// which commit() renames over FILE once it is complete, so FILE is either the old file or the
// whole new one.
//
// FILE may be missing or a regular file. A path that exists and is anything else (a device
// such as /dev/null, a FIFO, a directory, a socket) is refused before any temporary file is
// made: renaming over it would replace the device node with a regular file. A symbolic link
// to a regular file is written through (its target is replaced, the link stays); a link to
// anything else, or a dangling one, is refused. commit() checks the target once more just
// before renaming.
// Thread-safety: an AtomicFile is used by one owner; fd() may be written from several threads.
#pragma once

#include <string>

#include "moestream/status.h"

namespace moestream {

// What a file of mode `st_mode` (struct stat) is, for messages: "a directory", "a FIFO",
// "a character device", "a block device", "a socket", "a regular file", "not a file".
const char * file_kind(unsigned st_mode);

// Ok when `path` may be replaced by a regular file; kBadInput (an output that cannot be
// written: exit 3) naming what it is otherwise.
// `what` names the option in messages ("--route-trace", "-o").
Status check_output_path(const std::string & path, const std::string & what);

class AtomicFile {
public:
    AtomicFile() = default;
    ~AtomicFile();  // an uncommitted temporary file is removed
    AtomicFile(const AtomicFile &) = delete;
    AtomicFile & operator=(const AtomicFile &) = delete;

    // Checks `path` (check_output_path) and creates the temporary file (mode 0644).
    Status create(const std::string & path, const std::string & what);
    int fd() const { return fd_; }
    const std::string & temp_path() const { return tmp_; }
    const std::string & target() const { return target_; }
    int create_errno() const { return create_errno_; }  // errno of a failed create, else 0
    // The caller closed fd() itself (e.g. through fclose of an fdopen'ed FILE).
    void fd_closed() { fd_ = -1; }
    // fsync + close (unless closed), then rename over the target. On error the temporary
    // file is removed and the target is untouched.
    Status commit();
    // Removes the temporary file (also done by the destructor when not committed).
    void discard();

private:
    std::string what_, target_, tmp_;
    int fd_ = -1;
    int create_errno_ = 0;
};

}  // namespace moestream
