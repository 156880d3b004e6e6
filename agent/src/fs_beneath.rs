//! Path-safe file primitives: whatever the agent does as root inside an alloc dir goes through a
//! [`Beneath`], a directory handle whose paths the kernel resolves beneath it.
//!
//! A task controls what is in its alloc dir and may swap any entry for a symlink, a FIFO or a
//! hard link at any moment, so:
//! - every operation starts from a directory fd, never from a path string resolved again later;
//! - resolution is `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`: absolute symlinks,
//!   symlinks that climb out and `/proc` magic links fail during resolution itself, so there is no
//!   window between a check and the use. [`Links::Refuse`] adds `RESOLVE_NO_SYMLINKS` for paths
//!   where a symlink has no business at all (log files, directories the agent makes);
//! - `..` components and absolute paths are refused before any system call;
//! - files are checked on the opened fd (a regular file; for logs, one with a single link), and
//!   opened non-blocking and without a controlling terminal, so a FIFO or device put in the place
//!   of a file fails at once instead of hanging the opener;
//! - removal unlinks a symlink itself, never follows it, and never crosses a mount point;
//! - there is no fallback: on a kernel without `openat2` every call fails with
//!   [`FsError::Openat2Unavailable`], never with a plain open.
//!
//! The directory a [`Beneath`] is opened on ([`Beneath::open`]) is trusted: it comes from the
//! agent's configuration (the alloc root) or was itself resolved through a [`Beneath`].

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, OpenHow, RenameFlags, ResolveFlag, fcntl, openat2, renameat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, mkdirat};
use nix::unistd::{UnlinkatFlags, ftruncate, symlinkat, unlinkat};

/// Longest relative path accepted (the kernel's `PATH_MAX`).
const MAX_PATH: usize = 4096;
/// Longest single name accepted (the kernel's `NAME_MAX`).
const MAX_NAME: usize = 255;
/// Directory fds [`Beneath::remove_tree`] holds at once; deeper subtrees are moved up to the
/// top of the tree being removed and taken from there, so any depth costs bounded fds.
const MAX_HELD_DIRS: usize = 32;
/// How often [`Beneath::remove_tree`] scans a directory again that filled up while it was
/// being emptied, before giving up.
const MAX_RESCANS: u32 = 1000;
/// How often an `openat2` interrupted by a concurrent rename (`EAGAIN`) is retried.
const MAX_EAGAIN_RETRIES: u32 = 64;

/// Whether symlinks may be followed while resolving a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// No symlink anywhere in the path, the last component included (`RESOLVE_NO_SYMLINKS`).
    Refuse,
    /// Relative symlinks that stay beneath the directory are followed; absolute ones and ones
    /// that climb out of it are refused.
    Beneath,
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
    /// Character device.
    CharDevice,
    /// Block device.
    BlockDevice,
}

impl Kind {
    fn of_mode(mode: u32) -> Kind {
        match SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFLNK => Kind::Symlink,
            SFlag::S_IFIFO => Kind::Fifo,
            SFlag::S_IFSOCK => Kind::Socket,
            SFlag::S_IFCHR => Kind::CharDevice,
            SFlag::S_IFBLK => Kind::BlockDevice,
            _ => Kind::File,
        }
    }

    fn of_type(t: Type) -> Kind {
        match t {
            Type::File => Kind::File,
            Type::Directory => Kind::Dir,
            Type::Symlink => Kind::Symlink,
            Type::Fifo => Kind::Fifo,
            Type::Socket => Kind::Socket,
            Type::CharacterDevice => Kind::CharDevice,
            Type::BlockDevice => Kind::BlockDevice,
        }
    }

    /// Lowercase name for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::File => "regular file",
            Kind::Dir => "directory",
            Kind::Symlink => "symlink",
            Kind::Fifo => "fifo",
            Kind::Socket => "socket",
            Kind::CharDevice => "character device",
            Kind::BlockDevice => "block device",
        }
    }
}

/// An entry's metadata, as `lstat` gives it (a symlink is described, not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// What it is.
    pub kind: Kind,
    /// Size in bytes.
    pub len: u64,
    /// Hard links.
    pub links: u64,
    /// Device of the file system it is on.
    pub dev: u64,
    /// Permission bits (with setuid, setgid, sticky).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
}

impl Stat {
    fn of(st: &FileStat) -> Stat {
        Stat {
            kind: Kind::of_mode(st.st_mode),
            len: st.st_size.max(0) as u64,
            links: st.st_nlink,
            dev: st.st_dev,
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
        }
    }
}

/// Why a path-safe operation failed. Every variant names the directory and the path in it.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The kernel has no `openat2` (Linux older than 5.6); nothing is opened without it.
    #[error(
        "openat2(2) is not available on this kernel (Linux 5.6 or newer is required): refusing to open {} under {} without it",
        .path.display(), .base.display()
    )]
    Openat2Unavailable { base: PathBuf, path: PathBuf },
    /// The path itself is not acceptable (absolute, `..`, NUL, too long, not a plain name).
    #[error("{:?} under {}: {reason}", .path, .base.display())]
    BadPath { base: PathBuf, path: PathBuf, reason: &'static str },
    /// Resolution would leave the directory (an absolute symlink or one that climbs out).
    #[error("{} under {} resolves outside it", .path.display(), .base.display())]
    Escapes { base: PathBuf, path: PathBuf },
    /// A symlink where none is allowed, or a symlink loop.
    #[error("{} under {} is or passes through a symlink (or a symlink loop)", .path.display(), .base.display())]
    Symlink { base: PathBuf, path: PathBuf },
    /// Not a regular file (a FIFO, device, socket or directory in the place of a file).
    #[error("{} under {} is a {kind}, not a regular file", .path.display(), .base.display())]
    NotRegular { base: PathBuf, path: PathBuf, kind: &'static str },
    /// A file that must be the agent's own has more than one link, so it may be another file.
    #[error("{} under {} has {links} hard links instead of one: it may be another file's, refusing it", .path.display(), .base.display())]
    HardLinked { base: PathBuf, path: PathBuf, links: u64 },
    /// Removal reached a mount point and did not cross it.
    #[error("{} under {} is a mount point: refusing to remove across it", .path.display(), .base.display())]
    MountPoint { base: PathBuf, path: PathBuf },
    /// The trusted directory itself could not be opened.
    #[error("open directory {}: {source}", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Any other failure of the system call.
    #[error("{op} {} under {}: {source}", .path.display(), .base.display())]
    Io {
        op: &'static str,
        base: PathBuf,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl FsError {
    /// The entry (or a directory on the way to it) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, FsError::Io { source, .. } | FsError::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Checks that `name` is one plain path component: not empty, not `.` or `..`, no `/`, no NUL,
/// at most 255 bytes. Task, group and alloc names become directory names under this rule.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("is empty")
    } else if name == "." || name == ".." {
        Err("must not be \".\" or \"..\"")
    } else if name.contains('/') {
        Err("must not contain \"/\"")
    } else if name.contains('\0') {
        Err("must not contain a NUL byte")
    } else if name.len() > MAX_NAME {
        Err("is longer than 255 bytes")
    } else {
        Ok(())
    }
}

/// `rel` as a C path of plain components (`.` for an empty path).
fn clean(rel: &Path) -> Result<CString, &'static str> {
    let mut out: Vec<u8> = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(n.as_bytes());
            }
            Component::CurDir => {}
            Component::ParentDir => return Err("must not contain a \"..\" component"),
            Component::RootDir | Component::Prefix(_) => return Err("must be relative"),
        }
    }
    if out.len() > MAX_PATH {
        return Err("is longer than 4096 bytes");
    }
    if out.is_empty() {
        out.push(b'.');
    }
    CString::new(out).map_err(|_| "must not contain a NUL byte")
}

/// `rel` split into its parent (`None`: the directory itself) and its last component.
fn split(rel: &Path) -> Result<(Option<CString>, CString), &'static str> {
    let whole = clean(rel)?;
    let bytes = whole.as_bytes();
    if bytes == b"." {
        return Err("names no entry");
    }
    Ok(match bytes.iter().rposition(|b| *b == b'/') {
        None => (None, whole),
        Some(i) => (
            Some(CString::new(&bytes[..i]).map_err(|_| "must not contain a NUL byte")?),
            CString::new(&bytes[i + 1..]).map_err(|_| "must not contain a NUL byte")?,
        ),
    })
}

fn io(e: Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

/// `openat2` with the resolution rules of [`Links`], retried while a concurrent rename makes
/// the kernel ask for it (`EAGAIN`).
fn resolve_at(dir: BorrowedFd<'_>, rel: &CStr, flags: OFlag, mode: Mode, links: Links) -> Result<OwnedFd, Errno> {
    let mut resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS;
    if links == Links::Refuse {
        resolve |= ResolveFlag::RESOLVE_NO_SYMLINKS;
    }
    let how = OpenHow::new().flags(flags | OFlag::O_CLOEXEC).mode(mode).resolve(resolve);
    let mut attempts = 0;
    loop {
        match openat2(dir, rel, how) {
            Err(Errno::EAGAIN) if attempts < MAX_EAGAIN_RETRIES => attempts += 1,
            other => return other,
        }
    }
}

/// Opens a directory entry for removal: a directory on the same file system, reached without
/// any symlink. `ENOTDIR`/`ELOOP` mean "not a directory: unlink it", `EXDEV` "a mount point".
fn open_for_removal(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new().flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).resolve(
        ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS | ResolveFlag::RESOLVE_NO_XDEV,
    );
    openat2(dir, name, how)
}

/// A fresh directory stream over `dir` (its own file offset, so `dir` can be read again).
fn read_dir_of(dir: BorrowedFd<'_>) -> Result<Dir, Errno> {
    let fd = resolve_at(dir, c".", OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty(), Links::Refuse)?;
    Dir::from_fd(fd)
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

/// How a regular file is opened.
#[derive(Clone, Copy)]
enum Access {
    Read,
    Append,
    Write { truncate: bool },
}

/// A directory every path given to its methods is resolved beneath. See the module docs.
#[derive(Debug)]
pub struct Beneath {
    fd: OwnedFd,
    /// For messages (and programs that need a path): where it was when it was opened.
    path: PathBuf,
}

impl AsFd for Beneath {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Beneath {
    /// Opens `path`, a directory the agent trusts (its own configuration, or a directory it
    /// created in one), as the base for everything under it.
    pub fn open(path: &Path) -> Result<Beneath, FsError> {
        let fd = nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| FsError::Open { path: path.to_path_buf(), source: io(e) })?;
        Ok(Beneath { fd, path: path.to_path_buf() })
    }

    /// Where the directory was when it was opened (for messages; the fd is what counts).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `/proc/self/fd/<fd>`: the directory for `mount(2)` and other calls that take a path
    /// only, naming exactly this directory whatever happens to its path meanwhile.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// Where the directory is now, as the kernel knows it.
    pub fn real_path(&self) -> Result<PathBuf, FsError> {
        std::fs::read_link(self.fd_path()).map_err(|source| self.io_err("read the path of", Path::new("."), source))
    }

    /// A second handle on the same directory.
    pub fn try_clone(&self) -> Result<Beneath, FsError> {
        let fd = self.fd.try_clone().map_err(|source| self.io_err("duplicate", Path::new("."), source))?;
        Ok(Beneath { fd, path: self.path.clone() })
    }

    fn bad(&self, rel: &Path, reason: &'static str) -> FsError {
        FsError::BadPath { base: self.path.clone(), path: rel.to_path_buf(), reason }
    }

    fn io_err(&self, op: &'static str, rel: &Path, source: std::io::Error) -> FsError {
        FsError::Io { op, base: self.path.clone(), path: rel.to_path_buf(), source }
    }

    /// Maps an errno from resolving `rel` to what it means here.
    fn resolve_err(&self, op: &'static str, rel: &Path, e: Errno) -> FsError {
        let (base, path) = (self.path.clone(), rel.to_path_buf());
        match e {
            Errno::ENOSYS => FsError::Openat2Unavailable { base, path },
            Errno::EXDEV => FsError::Escapes { base, path },
            Errno::ELOOP => FsError::Symlink { base, path },
            e => FsError::Io { op, base, path, source: io(e) },
        }
    }

    fn resolve(&self, op: &'static str, rel: &Path, flags: OFlag, mode: Mode, links: Links) -> Result<OwnedFd, FsError> {
        let c = clean(rel).map_err(|reason| self.bad(rel, reason))?;
        resolve_at(self.fd.as_fd(), &c, flags, mode, links).map_err(|e| self.resolve_err(op, rel, e))
    }

    fn child(&self, fd: OwnedFd, rel: &Path) -> Beneath {
        Beneath { fd, path: self.path.join(rel) }
    }

    /// The parent directory of `rel` (resolved without symlinks) and `rel`'s last component.
    fn parent_of(&self, op: &'static str, rel: &Path) -> Result<(Option<Beneath>, CString), FsError> {
        let (parent, name) = split(rel).map_err(|reason| self.bad(rel, reason))?;
        let parent = match parent {
            None => None,
            Some(p) => {
                let p = PathBuf::from(OsStr::from_bytes(p.as_bytes()));
                let fd = self.resolve(op, &p, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty(), Links::Refuse)?;
                Some(self.child(fd, &p))
            }
        };
        Ok((parent, name))
    }

    /// Opens the directory at `rel` beneath this one.
    pub fn open_dir(&self, rel: &Path, links: Links) -> Result<Beneath, FsError> {
        // No O_NOFOLLOW: with O_DIRECTORY it turns a trailing symlink into ENOTDIR, while
        // RESOLVE_NO_SYMLINKS refuses it as what it is (ELOOP).
        let fd = self.resolve("open directory", rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty(), links)?;
        Ok(self.child(fd, rel))
    }

    /// Creates `rel` and every missing directory on the way (no symlinks anywhere), each new
    /// one with exactly `mode` (the umask does not apply), and sets `rel` itself to `mode`
    /// even if it existed. Returns a handle on it.
    pub fn create_dir_all(&self, rel: &Path, mode: u32) -> Result<Beneath, FsError> {
        let c = clean(rel).map_err(|reason| self.bad(rel, reason))?;
        if c.as_bytes() == b"." {
            return Err(self.bad(rel, "names no entry"));
        }
        let mode = Mode::from_bits_truncate(mode);
        let mut cur: OwnedFd = self.fd.try_clone().map_err(|source| self.io_err("duplicate", Path::new("."), source))?;
        let mut walked = PathBuf::new();
        for part in c.as_bytes().split(|b| *b == b'/') {
            let name = CString::new(part).map_err(|_| self.bad(rel, "must not contain a NUL byte"))?;
            walked.push(OsStr::from_bytes(part));
            let created = match mkdirat(cur.as_fd(), name.as_c_str(), mode) {
                Ok(()) => true,
                Err(Errno::EEXIST) => false,
                Err(e) => return Err(self.io_err("create directory", &walked, io(e))),
            };
            let next = resolve_at(cur.as_fd(), &name, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty(), Links::Refuse)
                .map_err(|e| self.resolve_err("open directory", &walked, e))?;
            if created {
                fchmod(next.as_fd(), mode).map_err(|e| self.io_err("chmod", &walked, io(e)))?;
            }
            cur = next;
        }
        fchmod(cur.as_fd(), mode).map_err(|e| self.io_err("chmod", rel, io(e)))?;
        Ok(self.child(cur, rel))
    }

    /// Opens a regular file and checks it on the fd. Non-blocking and `O_NOCTTY` at open, so a
    /// FIFO or device in its place cannot hang or adopt us; blocking again before it is returned.
    fn open_regular(&self, rel: &Path, access: Access, create_mode: Option<u32>, links: Links, single_link: bool) -> Result<File, FsError> {
        let mut flags = OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        flags |= match access {
            Access::Read => OFlag::O_RDONLY,
            Access::Append => OFlag::O_WRONLY | OFlag::O_APPEND,
            // Truncated only once it is known to be ours: a hard link's other name keeps its data.
            Access::Write { .. } => OFlag::O_WRONLY,
        };
        if links == Links::Refuse {
            flags |= OFlag::O_NOFOLLOW;
        }
        let mode = match create_mode {
            Some(m) => {
                flags |= OFlag::O_CREAT;
                Mode::from_bits_truncate(m)
            }
            None => Mode::empty(),
        };
        let op = match access {
            Access::Read => "open",
            _ => "open for writing",
        };
        let fd = match self.resolve(op, rel, flags, mode, links) {
            Ok(fd) => fd,
            // A FIFO without a reader (opened for writing), or a device without a driver.
            Err(FsError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENXIO) => {
                let kind = self.stat(rel, links).map(|s| s.kind.describe()).unwrap_or("special file");
                return Err(FsError::NotRegular { base: self.path.clone(), path: rel.to_path_buf(), kind });
            }
            Err(FsError::Io { source, .. }) if source.raw_os_error() == Some(libc::EISDIR) => {
                return Err(FsError::NotRegular { base: self.path.clone(), path: rel.to_path_buf(), kind: "directory" });
            }
            Err(e) => return Err(e),
        };
        let st = Stat::of(&fstat(fd.as_fd()).map_err(|e| self.io_err("stat", rel, io(e)))?);
        if st.kind != Kind::File {
            return Err(FsError::NotRegular { base: self.path.clone(), path: rel.to_path_buf(), kind: st.kind.describe() });
        }
        if single_link && st.links != 1 {
            return Err(FsError::HardLinked { base: self.path.clone(), path: rel.to_path_buf(), links: st.links });
        }
        let fl = fcntl(fd.as_fd(), FcntlArg::F_GETFL).map_err(|e| self.io_err("fcntl", rel, io(e)))?;
        let blocking = OFlag::from_bits_truncate(fl) & !OFlag::O_NONBLOCK;
        fcntl(fd.as_fd(), FcntlArg::F_SETFL(blocking)).map_err(|e| self.io_err("fcntl", rel, io(e)))?;
        if let Access::Write { truncate: true } = access {
            ftruncate(fd.as_fd(), 0).map_err(|e| self.io_err("truncate", rel, io(e)))?;
        }
        Ok(File::from(fd))
    }

    /// Opens the regular file at `rel` for reading.
    pub fn read(&self, rel: &Path, links: Links) -> Result<File, FsError> {
        self.open_regular(rel, Access::Read, None, links, false)
    }

    /// Opens the regular file at `rel` for writing, creating it with `mode` if missing, and
    /// empties it once it is known to be a regular file of a single link.
    pub fn write(&self, rel: &Path, mode: u32, links: Links) -> Result<File, FsError> {
        self.open_regular(rel, Access::Write { truncate: true }, Some(mode), links, true)
    }

    /// Makes sure a regular file exists at `rel` (created with `mode`), leaving its contents;
    /// no symlink anywhere. For mount points of single files.
    pub fn create_file(&self, rel: &Path, mode: u32) -> Result<File, FsError> {
        self.open_regular(rel, Access::Write { truncate: false }, Some(mode), Links::Refuse, false)
    }

    /// A log file `name` in this directory, opened for appending (created with `mode`): no
    /// symlink, a regular file, and one link only, so it is not another file's other name.
    pub fn append_log(&self, name: &str, mode: u32) -> Result<File, FsError> {
        check_name(name).map_err(|reason| self.bad(Path::new(name), reason))?;
        self.open_regular(Path::new(name), Access::Append, Some(mode), Links::Refuse, true)
    }

    /// A log file `name` in this directory, opened for reading, under the rules of
    /// [`Beneath::append_log`].
    pub fn read_log(&self, name: &str) -> Result<File, FsError> {
        check_name(name).map_err(|reason| self.bad(Path::new(name), reason))?;
        self.open_regular(Path::new(name), Access::Read, None, Links::Refuse, true)
    }

    /// Metadata of `rel` (`.` for this directory); a last-component symlink is described, not
    /// followed.
    pub fn stat(&self, rel: &Path, links: Links) -> Result<Stat, FsError> {
        let fd = self.resolve("stat", rel, OFlag::O_PATH | OFlag::O_NOFOLLOW, Mode::empty(), links)?;
        Ok(Stat::of(&fstat(fd.as_fd()).map_err(|e| self.io_err("stat", rel, io(e)))?))
    }

    /// Sets the permission bits of the entry at `rel`, which must be a `kind` (a unix socket a
    /// task should reach, say): resolved without symlinks, checked and changed on the entry it
    /// opened, so an entry swapped meanwhile for a symlink is refused, never followed.
    pub fn set_mode(&self, rel: &Path, kind: Kind, mode: u32) -> Result<(), FsError> {
        let fd = self.resolve("chmod", rel, OFlag::O_PATH | OFlag::O_NOFOLLOW, Mode::empty(), Links::Refuse)?;
        let st = Stat::of(&fstat(fd.as_fd()).map_err(|e| self.io_err("stat", rel, io(e)))?);
        if st.kind != kind {
            let what =
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("it is a {}, not a {}", st.kind.describe(), kind.describe()));
            return Err(self.io_err("chmod", rel, what));
        }
        // chmod(2) on the O_PATH fd's magic link changes exactly the inode opened above.
        let magic = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        nix::sys::stat::fchmodat(nix::fcntl::AT_FDCWD, &magic, Mode::from_bits_truncate(mode), nix::sys::stat::FchmodatFlags::FollowSymlink)
            .map_err(|e| self.io_err("chmod", rel, io(e)))
    }

    /// Calls `f` with the name and type (when the file system reports it) of every entry of
    /// this directory, `.` and `..` left out. Nothing is collected: the caller keeps what it
    /// needs, so a directory a task filled costs time, not memory.
    pub fn for_each_entry(&self, mut f: impl FnMut(&OsStr, Option<Kind>)) -> Result<(), FsError> {
        let mut dir = read_dir_of(self.fd.as_fd()).map_err(|e| self.resolve_err("list", Path::new("."), e))?;
        for entry in dir.iter() {
            let entry = entry.map_err(|e| self.io_err("list", Path::new("."), io(e)))?;
            if is_dot(entry.file_name()) {
                continue;
            }
            f(OsStr::from_bytes(entry.file_name().to_bytes()), entry.file_type().map(Kind::of_type));
        }
        Ok(())
    }

    /// Removes the entry at `rel` that is not a directory (a symlink is removed itself).
    pub fn remove_file(&self, rel: &Path) -> Result<(), FsError> {
        let (parent, name) = self.parent_of("remove", rel)?;
        let dir = parent.as_ref().map_or(self.fd.as_fd(), |p| p.fd.as_fd());
        unlinkat(dir, name.as_c_str(), UnlinkatFlags::NoRemoveDir).map_err(|e| self.io_err("remove", rel, io(e)))
    }

    /// Moves the entry at `rel` to `to_rel` beneath `to` (replacing what is there, as
    /// `rename(2)` does: a symlink in the way is replaced, never followed). Both parents are
    /// resolved without symlinks; a move across file systems fails with `EXDEV`.
    pub fn rename(&self, rel: &Path, to: &Beneath, to_rel: &Path) -> Result<(), FsError> {
        let (from_parent, from_name) = self.parent_of("rename", rel)?;
        let (to_parent, to_name) = to.parent_of("rename", to_rel)?;
        let from_dir = from_parent.as_ref().map_or(self.fd.as_fd(), |p| p.fd.as_fd());
        let to_dir = to_parent.as_ref().map_or(to.fd.as_fd(), |p| p.fd.as_fd());
        renameat2(from_dir, from_name.as_c_str(), to_dir, to_name.as_c_str(), RenameFlags::empty())
            .map_err(|e| self.io_err("rename", rel, io(e)))
    }

    /// Creates a symlink at `rel` pointing to `target` (stored as given, never resolved here).
    pub fn symlink(&self, rel: &Path, target: &Path) -> Result<(), FsError> {
        let (parent, name) = self.parent_of("create symlink", rel)?;
        let dir = parent.as_ref().map_or(self.fd.as_fd(), |p| p.fd.as_fd());
        symlinkat(target, dir, name.as_c_str()).map_err(|e| self.io_err("create symlink", rel, io(e)))
    }

    /// Removes `rel` and everything under it; nothing there is fine. Symlinks are unlinked
    /// themselves and never followed; a mount point is never crossed (its removal fails and
    /// what is mounted stays intact). Works at any depth with at most [`MAX_HELD_DIRS`] fds.
    pub fn remove_tree(&self, rel: &Path) -> Result<(), FsError> {
        let (parent, name) = self.parent_of("remove", rel)?;
        let parent_fd = parent.as_ref().map_or(self.fd.as_fd(), |p| p.fd.as_fd());
        let top = match open_for_removal(parent_fd, &name) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(()),
            Err(Errno::ENOTDIR | Errno::ELOOP) => {
                return match unlinkat(parent_fd, name.as_c_str(), UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => Ok(()),
                    Err(e) => Err(self.io_err("remove", rel, io(e))),
                };
            }
            Err(Errno::EXDEV) => return Err(FsError::MountPoint { base: self.path.clone(), path: rel.to_path_buf() }),
            Err(e) => return Err(self.resolve_err("open directory", rel, e)),
        };
        TreeRemoval { base: self, rel, parent: parent_fd, stack: vec![(top, name)], moved: 0, rescans: 0 }.run()
    }
}

/// The iterative walk behind [`Beneath::remove_tree`]: `stack` holds the open directories from
/// the top of the tree down to the one being emptied, each with its name in the one above.
struct TreeRemoval<'a> {
    base: &'a Beneath,
    rel: &'a Path,
    parent: BorrowedFd<'a>,
    stack: Vec<(OwnedFd, CString)>,
    moved: u64,
    rescans: u32,
}

impl TreeRemoval<'_> {
    fn err(&self, op: &'static str, e: Errno) -> FsError {
        self.base.io_err(op, self.rel, io(e))
    }

    fn mount_point(&self, name: &CStr) -> FsError {
        let mut path = self.rel.to_path_buf();
        for (_, n) in self.stack.iter().skip(1) {
            path.push(OsStr::from_bytes(n.to_bytes()));
        }
        path.push(OsStr::from_bytes(name.to_bytes()));
        FsError::MountPoint { base: self.base.path.clone(), path }
    }

    fn run(mut self) -> Result<(), FsError> {
        while let Some((dir_fd, _)) = self.stack.last() {
            let subdir = self.unlink_all_but_one_subdir(dir_fd.as_fd())?;
            match subdir {
                Some((fd, name)) if self.stack.len() < MAX_HELD_DIRS => self.stack.push((fd, name)),
                Some((_, name)) => self.move_to_top(&name)?,
                None => {
                    let (fd, name) = self.stack.pop().expect("the loop checked it");
                    let above = self.stack.last().map_or(self.parent, |(f, _)| f.as_fd());
                    match unlinkat(above, name.as_c_str(), UnlinkatFlags::RemoveDir) {
                        Ok(()) | Err(Errno::ENOENT) => {}
                        // Something appeared in it meanwhile: empty it again.
                        Err(Errno::ENOTEMPTY | Errno::EEXIST) if self.rescans < MAX_RESCANS => {
                            self.rescans += 1;
                            self.stack.push((fd, name));
                        }
                        Err(e) => return Err(self.err("remove directory", e)),
                    }
                }
            }
        }
        Ok(())
    }

    /// Unlinks every entry of `dir` that is not a directory, up to the first directory found,
    /// which is returned open (to be emptied next).
    fn unlink_all_but_one_subdir(&self, dir: BorrowedFd<'_>) -> Result<Option<(OwnedFd, CString)>, FsError> {
        let mut stream = read_dir_of(dir).map_err(|e| self.err("list", e))?;
        for entry in stream.iter() {
            let entry = entry.map_err(|e| self.err("list", e))?;
            let name = entry.file_name();
            if is_dot(name) {
                continue;
            }
            if matches!(entry.file_type(), None | Some(Type::Directory)) {
                match open_for_removal(dir, name) {
                    Ok(fd) => return Ok(Some((fd, name.to_owned()))),
                    Err(Errno::ENOENT) => continue,
                    Err(Errno::ENOTDIR | Errno::ELOOP) => {}
                    Err(Errno::EXDEV) => return Err(self.mount_point(name)),
                    Err(e) => return Err(self.err("open directory", e)),
                }
            }
            match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
                // EISDIR: it became a directory meanwhile; the directory's removal rescans.
                Ok(()) | Err(Errno::ENOENT | Errno::EISDIR) => {}
                Err(e) => return Err(self.err("remove", e)),
            }
        }
        Ok(None)
    }

    /// Moves a subtree too deep to hold another fd for up to the top of the tree, where the
    /// walk finds it again once it is back there.
    fn move_to_top(&mut self, name: &CStr) -> Result<(), FsError> {
        let (from, _) = self.stack.last().expect("called with a non-empty stack");
        let (top, _) = &self.stack[0];
        loop {
            let to = CString::new(format!(".nomad-rs-removing-{}", self.moved)).expect("no NUL in a formatted number");
            self.moved += 1;
            match renameat2(from.as_fd(), name, top.as_fd(), to.as_c_str(), RenameFlags::RENAME_NOREPLACE) {
                Ok(()) | Err(Errno::ENOENT) => return Ok(()),
                Err(Errno::EEXIST) => continue,
                Err(Errno::EXDEV | Errno::EBUSY) => return Err(self.mount_point(name)),
                Err(e) => return Err(self.err("move", e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use super::*;

    /// A base dir to work in and, next to it, an outside dir holding a root-only victim file.
    struct Setup {
        _tmp: tempfile::TempDir,
        base: PathBuf,
        outside: PathBuf,
        victim: PathBuf,
    }

    const VICTIM: &[u8] = b"root:$6$secret-hash:19000:0:99999:7:::\n";

    fn setup() -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("base");
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&base).unwrap();
        std::fs::create_dir(&outside).unwrap();
        let victim = outside.join("shadow");
        std::fs::write(&victim, VICTIM).unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        Setup { _tmp: tmp, base, outside, victim }
    }

    fn read_all(mut f: File) -> Vec<u8> {
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn a_symlink_to_outside_is_never_followed() {
        let s = setup();
        symlink(&s.victim, s.base.join("abs")).unwrap();
        symlink("../outside/shadow", s.base.join("rel")).unwrap();
        symlink(&s.outside, s.base.join("absdir")).unwrap();
        let b = Beneath::open(&s.base).unwrap();
        for name in ["abs", "rel"] {
            assert!(matches!(b.read(Path::new(name), Links::Beneath), Err(FsError::Escapes { .. })), "{name}");
            assert!(matches!(b.read(Path::new(name), Links::Refuse), Err(FsError::Symlink { .. })), "{name}");
            assert!(matches!(b.read_log(name), Err(FsError::Symlink { .. })), "{name}");
            assert!(matches!(b.append_log(name, 0o644), Err(FsError::Symlink { .. })), "{name}");
            assert!(matches!(b.write(Path::new(name), 0o644, Links::Beneath), Err(FsError::Escapes { .. })), "{name}");
        }
        assert!(matches!(b.open_dir(Path::new("absdir"), Links::Beneath), Err(FsError::Escapes { .. })));
        assert!(matches!(b.read(Path::new("absdir/shadow"), Links::Beneath), Err(FsError::Escapes { .. })));
        assert!(matches!(b.create_dir_all(Path::new("absdir/new"), 0o755), Err(FsError::Symlink { .. })));
        assert!(!s.outside.join("new").exists());
        let err = b.read_log("abs").unwrap_err().to_string();
        assert!(err.contains("abs") && err.contains("symlink") && err.contains(&s.base.display().to_string()), "{err}");
        // Stat describes the link, never the target (no size of the victim leaks).
        let st = b.stat(Path::new("abs"), Links::Refuse).unwrap();
        assert_eq!(st.kind, Kind::Symlink);
        assert_eq!(std::fs::read(&s.victim).unwrap(), VICTIM);
    }

    #[test]
    fn an_absolute_symlink_is_refused_even_when_it_points_inside() {
        let s = setup();
        std::fs::write(s.base.join("inside"), b"ok").unwrap();
        symlink(s.base.join("inside"), s.base.join("abs-inside")).unwrap();
        symlink("inside", s.base.join("rel-inside")).unwrap();
        let b = Beneath::open(&s.base).unwrap();
        assert!(matches!(b.read(Path::new("abs-inside"), Links::Beneath), Err(FsError::Escapes { .. })));
        assert_eq!(read_all(b.read(Path::new("rel-inside"), Links::Beneath).unwrap()), b"ok", "a relative link inside is fine");
        assert!(matches!(b.read(Path::new("rel-inside"), Links::Refuse), Err(FsError::Symlink { .. })));
    }

    #[test]
    fn dot_dot_and_absolute_paths_are_refused_before_any_call() {
        let s = setup();
        std::fs::create_dir(s.base.join("a")).unwrap();
        let b = Beneath::open(&s.base).unwrap();
        for p in ["../outside/shadow", "a/../../outside/shadow", "a/..", "/etc/shadow"] {
            let e = b.read(Path::new(p), Links::Beneath).unwrap_err();
            assert!(matches!(e, FsError::BadPath { .. }), "{p}: {e}");
            assert!(matches!(b.remove_tree(Path::new(p)), Err(FsError::BadPath { .. })), "{p}");
            assert!(matches!(b.create_dir_all(Path::new(p), 0o755), Err(FsError::BadPath { .. })), "{p}");
        }
        for name in ["..", ".", "", "a/b", "x\0y"] {
            assert!(matches!(b.append_log(name, 0o644), Err(FsError::BadPath { .. })), "{name:?}");
        }
        assert!(matches!(b.remove_tree(Path::new("")), Err(FsError::BadPath { .. })), "the base itself is never removed by it");
        assert!(s.victim.exists() && s.base.join("a").is_dir());
    }

    #[test]
    fn check_name_takes_only_plain_components() {
        for ok in ["web", "web.1", "a b", "..x", "x..", "ünï"] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        assert_eq!(check_name(""), Err("is empty"));
        assert_eq!(check_name("."), Err("must not be \".\" or \"..\""));
        assert_eq!(check_name(".."), Err("must not be \".\" or \"..\""));
        assert_eq!(check_name("a/b"), Err("must not contain \"/\""));
        assert_eq!(check_name("/"), Err("must not contain \"/\""));
        assert_eq!(check_name("a\0"), Err("must not contain a NUL byte"));
        assert_eq!(check_name(&"x".repeat(256)), Err("is longer than 255 bytes"));
    }

    #[test]
    fn symlink_loops_fail_with_an_error() {
        let s = setup();
        symlink("b", s.base.join("a")).unwrap();
        symlink("a", s.base.join("b")).unwrap();
        symlink("self", s.base.join("self")).unwrap();
        let b = Beneath::open(&s.base).unwrap();
        for name in ["a", "self"] {
            assert!(matches!(b.read(Path::new(name), Links::Beneath), Err(FsError::Symlink { .. })), "{name}");
            assert!(matches!(b.open_dir(Path::new(name), Links::Beneath), Err(FsError::Symlink { .. })), "{name}");
        }
        b.remove_tree(Path::new("a")).unwrap();
        assert!(std::fs::symlink_metadata(s.base.join("a")).is_err(), "the link itself is removed");
    }

    #[test]
    fn a_fifo_in_place_of_a_log_fails_at_once_instead_of_hanging() {
        let s = setup();
        nix::unistd::mkfifo(&s.base.join("web.stdout.0"), Mode::from_bits_truncate(0o666)).unwrap();
        let b = Beneath::open(&s.base).unwrap();
        let start = Instant::now();
        let e = b.append_log("web.stdout.0", 0o644).unwrap_err();
        assert!(matches!(e, FsError::NotRegular { kind: "fifo", .. }), "{e}");
        let e = b.read_log("web.stdout.0").unwrap_err();
        assert!(matches!(e, FsError::NotRegular { kind: "fifo", .. }), "{e}");
        assert!(matches!(b.read(Path::new("web.stdout.0"), Links::Beneath), Err(FsError::NotRegular { .. })));
        assert!(matches!(b.write(Path::new("web.stdout.0"), 0o644, Links::Beneath), Err(FsError::NotRegular { .. })));
        // Opening a FIFO for reading without O_NONBLOCK would wait for a writer forever.
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(e.to_string().contains("is a fifo, not a regular file"), "{e}");
    }

    #[test]
    fn a_hard_link_is_not_taken_for_a_log_and_is_never_truncated() {
        let s = setup();
        let mine = s.base.join("mine");
        std::fs::write(&mine, b"precious").unwrap();
        std::fs::hard_link(&mine, s.base.join("web.stdout.0")).unwrap();
        let b = Beneath::open(&s.base).unwrap();
        assert!(matches!(b.append_log("web.stdout.0", 0o644), Err(FsError::HardLinked { links: 2, .. })));
        assert!(matches!(b.read_log("web.stdout.0"), Err(FsError::HardLinked { .. })));
        assert!(matches!(b.write(Path::new("web.stdout.0"), 0o644, Links::Refuse), Err(FsError::HardLinked { .. })));
        assert_eq!(std::fs::read(&mine).unwrap(), b"precious");
    }

    #[test]
    fn logs_append_and_files_write_inside() {
        let s = setup();
        let b = Beneath::open(&s.base).unwrap();
        let logs = b.create_dir_all(Path::new("alloc/logs"), 0o777).unwrap();
        logs.append_log("web.stdout.0", 0o644).unwrap().write_all(b"one ").unwrap();
        logs.append_log("web.stdout.0", 0o644).unwrap().write_all(b"two").unwrap();
        assert_eq!(read_all(logs.read_log("web.stdout.0").unwrap()), b"one two");
        b.write(Path::new("alloc/data/x"), 0o600, Links::Refuse).unwrap_err(); // no parent made for it
        b.create_dir_all(Path::new("alloc/data"), 0o777).unwrap();
        b.write(Path::new("alloc/data/x"), 0o600, Links::Refuse).unwrap().write_all(b"long content").unwrap();
        b.write(Path::new("alloc/data/x"), 0o600, Links::Refuse).unwrap().write_all(b"short").unwrap();
        assert_eq!(std::fs::read(s.base.join("alloc/data/x")).unwrap(), b"short", "write truncates");
        let mut names = Vec::new();
        logs.for_each_entry(|n, k| names.push((n.to_string_lossy().into_owned(), k))).unwrap();
        assert_eq!(names, vec![("web.stdout.0".to_string(), Some(Kind::File))]);
        logs.remove_file(Path::new("web.stdout.0")).unwrap();
        assert!(logs.read_log("web.stdout.0").unwrap_err().is_not_found());
    }

    #[test]
    fn create_dir_all_sets_exact_modes_whatever_the_umask() {
        let s = setup();
        let b = Beneath::open(&s.base).unwrap();
        b.create_dir_all(Path::new("a/tmp"), 0o1777).unwrap();
        let mode = |p: &str| std::fs::metadata(s.base.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("a"), 0o1777, "a missing parent gets the mode too");
        assert_eq!(mode("a/tmp"), 0o1777);
        b.create_dir_all(Path::new("a"), 0o755).unwrap();
        assert_eq!(mode("a"), 0o755, "an existing dir is set to the mode");
        std::fs::write(s.base.join("file"), b"").unwrap();
        assert!(b.create_dir_all(Path::new("file"), 0o755).is_err(), "a file is not a directory");
    }

    #[test]
    fn a_symlink_swapped_in_between_check_and_use_is_never_followed() {
        // One thread flips an entry between a regular file and a symlink to the victim as fast as
        // it can; the other keeps appending and reading through it. Whatever the interleaving,
        // the victim is never read or written.
        let s = setup();
        let b = Beneath::open(&s.base).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (base, victim) = (s.base.clone(), s.victim.clone());
        let flipper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (entry, tmp_link, tmp_file) = (base.join("web.stdout.0"), base.join(".link"), base.join(".file"));
                while !stop.load(Ordering::Relaxed) {
                    let _ = symlink(&victim, &tmp_link);
                    let _ = std::fs::rename(&tmp_link, &entry);
                    let _ = std::fs::write(&tmp_file, b"");
                    let _ = std::fs::rename(&tmp_file, &entry);
                }
            })
        };
        let (mut appended, mut refused) = (0, 0);
        for _ in 0..20_000 {
            match b.append_log("web.stdout.0", 0o644) {
                Ok(mut f) => {
                    f.write_all(b"task output\n").unwrap();
                    appended += 1;
                }
                Err(FsError::Symlink { .. }) => refused += 1,
                // Opened just before the flipper renamed over it: now linked nowhere.
                Err(FsError::HardLinked { links: 0, .. }) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => panic!("unexpected: {e}"),
            }
            if let Ok(f) = b.read_log("web.stdout.0") {
                assert!(!read_all(f).windows(6).any(|w| w == b"secret"), "the victim was read");
            }
        }
        stop.store(true, Ordering::Relaxed);
        flipper.join().unwrap();
        assert!(appended > 0, "some opens hit the regular file");
        assert_eq!(std::fs::read(&s.victim).unwrap(), VICTIM, "the victim is byte for byte unchanged ({refused} refused)");
    }

    #[test]
    fn a_held_directory_keeps_pointing_inside_when_its_path_is_swapped() {
        let s = setup();
        let b = Beneath::open(&s.base).unwrap();
        let logs = b.create_dir_all(Path::new("logs"), 0o777).unwrap();
        std::fs::rename(s.base.join("logs"), s.base.join("moved")).unwrap();
        symlink(&s.outside, s.base.join("logs")).unwrap();
        logs.append_log("shadow", 0o644).unwrap().write_all(b"x").unwrap();
        assert_eq!(std::fs::read(s.base.join("moved/shadow")).unwrap(), b"x");
        assert!(matches!(b.open_dir(Path::new("logs"), Links::Refuse), Err(FsError::Symlink { .. })));
        assert_eq!(std::fs::read(&s.victim).unwrap(), VICTIM);
    }

    #[test]
    fn remove_tree_unlinks_symlinks_and_never_follows_them() {
        let s = setup();
        let tree = s.base.join("alloc1");
        std::fs::create_dir_all(tree.join("alloc/logs")).unwrap();
        std::fs::create_dir_all(tree.join("web/local")).unwrap();
        std::fs::write(tree.join("web/local/file"), b"x").unwrap();
        symlink(&s.outside, tree.join("alloc/logs/to-outside-dir")).unwrap();
        symlink(&s.victim, tree.join("alloc/logs/web.stdout.0")).unwrap();
        symlink("../../..", tree.join("web/local/up")).unwrap();
        nix::unistd::mkfifo(&tree.join("alloc/logs/fifo"), Mode::from_bits_truncate(0o666)).unwrap();
        std::fs::set_permissions(tree.join("web/local"), std::fs::Permissions::from_mode(0o777)).unwrap();
        // Deeper than the fds the walk may hold at once.
        let mut deep = tree.join("web/deep");
        for i in 0..(MAX_HELD_DIRS * 3) {
            deep.push(format!("d{i}"));
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("leaf"), b"x").unwrap();
        symlink(&s.outside, s.base.join("top-link")).unwrap();

        let b = Beneath::open(&s.base).unwrap();
        b.remove_tree(Path::new("alloc1")).unwrap();
        assert!(!tree.exists());
        b.remove_tree(Path::new("alloc1")).unwrap(); // gone already: fine
        b.remove_tree(Path::new("top-link")).unwrap();
        assert!(std::fs::symlink_metadata(s.base.join("top-link")).is_err(), "a top-level link is removed itself");
        assert_eq!(std::fs::read(&s.victim).unwrap(), VICTIM);
        assert!(s.outside.is_dir() && s.base.is_dir());
    }

    #[test]
    fn remove_tree_does_not_cross_a_mount_point() {
        nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Root); // to mount a tmpfs
        let s = setup();
        let mnt = s.base.join("alloc1/web/secrets");
        std::fs::create_dir_all(&mnt).unwrap();
        nix::mount::mount(Some("tmpfs"), &mnt, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=64k")).unwrap();
        std::fs::write(mnt.join("token"), b"keep").unwrap();
        let b = Beneath::open(&s.base).unwrap();
        let e = b.remove_tree(Path::new("alloc1")).unwrap_err();
        let kept = std::fs::read(mnt.join("token"));
        nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert!(matches!(e, FsError::MountPoint { .. }), "{e}");
        assert!(e.to_string().contains("alloc1/web/secrets"), "{e}");
        assert_eq!(kept.unwrap(), b"keep", "nothing on the mounted file system was removed");
        b.remove_tree(Path::new("alloc1")).unwrap();
        assert!(!s.base.join("alloc1").exists());
    }

    #[test]
    fn errors_say_what_and_where() {
        let base = PathBuf::from("/a/b");
        let b = Beneath { fd: nix::fcntl::open("/", OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap(), path: base };
        let e = b.resolve_err("open", Path::new("logs/x"), Errno::ENOSYS);
        assert_eq!(
            e.to_string(),
            "openat2(2) is not available on this kernel (Linux 5.6 or newer is required): refusing to open logs/x under /a/b without it"
        );
        assert_eq!(b.resolve_err("open", Path::new("x"), Errno::EXDEV).to_string(), "x under /a/b resolves outside it");
        assert_eq!(b.resolve_err("open", Path::new("x"), Errno::EACCES).to_string(), "open x under /a/b: Permission denied (os error 13)");
        assert!(b.resolve_err("open", Path::new("x"), Errno::ENOENT).is_not_found());
    }

    #[test]
    fn fd_path_and_real_path_name_the_directory_itself() {
        let s = setup();
        let b = Beneath::open(&s.base).unwrap();
        let d = b.create_dir_all(Path::new("secrets"), 0o700).unwrap();
        assert_eq!(d.real_path().unwrap(), s.base.join("secrets").canonicalize().unwrap());
        assert!(std::fs::metadata(d.fd_path()).unwrap().is_dir());
        std::fs::rename(s.base.join("secrets"), s.base.join("elsewhere")).unwrap();
        assert_eq!(d.real_path().unwrap(), s.base.join("elsewhere").canonicalize().unwrap());
    }
}
