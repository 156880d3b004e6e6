//! Size-rotated task log files, named as Nomad names them: `<task>.stdout.<N>`.
//!
//! The index only grows; when the current file is full the next index is opened and the file
//! `max_files` indexes back is removed. Writing never fails the caller: a full disk or a vanished
//! directory drops the bytes, counts them, and the next write tries again.
//!
//! The log directory is inside the alloc dir, which the task can write, and the executor runs as
//! root: every open goes through [`Beneath`] from the alloc dir, with no symlink anywhere on the
//! way, and takes only a regular file with a single link (see `fs_beneath`). Whatever the task
//! puts in place of a log file (a symlink to a host file, a FIFO, a hard link) is refused and
//! its bytes are dropped; removal of an old file unlinks the name, never what it points to.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::fs_beneath::{Beneath, FsError, Links};

/// Mode of a log file the executor creates.
const LOG_FILE_MODE: u32 = 0o644;
/// Mode of the log dir, if the executor has to create it again (as the alloc_dir hook does).
const LOG_DIR_MODE: u32 = 0o777;

/// One stream's rotating log (stdout or stderr).
#[derive(Debug)]
pub struct RotatingLog {
    /// The alloc dir; `dir` is resolved beneath it at every open.
    alloc_dir: Beneath,
    /// The log dir, relative to `alloc_dir` (`alloc/logs`).
    dir: PathBuf,
    /// `<task>.stdout` or `<task>.stderr`.
    base: String,
    max_files: u64,
    max_file_size: u64,
    index: u64,
    size: u64,
    file: Option<File>,
    dropped_bytes: u64,
    /// The last refusal reported on stderr (the executor's log), so a loop of them says it once.
    last_error: Option<String>,
}

impl RotatingLog {
    /// Continues after the highest existing index, so a restarted task appends to its logs, and
    /// removes the files already beyond `max_files`.
    pub fn new(alloc_dir: Beneath, dir: &Path, base: &str, max_files: u32, max_file_size: u64) -> RotatingLog {
        let mut log = RotatingLog {
            alloc_dir,
            dir: dir.to_path_buf(),
            base: base.to_string(),
            max_files: u64::from(max_files.max(1)),
            max_file_size: max_file_size.max(1),
            index: 0,
            size: 0,
            file: None,
            dropped_bytes: 0,
            last_error: None,
        };
        if let Ok(logs) = log.alloc_dir.open_dir(&log.dir, Links::Refuse) {
            let mut indexes = Vec::new();
            let _ = logs.for_each_entry(|name, _| {
                if let Some(i) = log.index_of(name) {
                    log.index = log.index.max(i);
                    indexes.push(i);
                }
            });
            for i in indexes.into_iter().filter(|i| log.stale(*i)) {
                let _ = logs.remove_file(Path::new(&log.name_of(i)));
            }
        }
        log
    }

    /// Name of the file with this index.
    pub fn name_of(&self, index: u64) -> String {
        format!("{}.{index}", self.base)
    }

    fn index_of(&self, name: &std::ffi::OsStr) -> Option<u64> {
        name.to_str()?.strip_prefix(self.base.as_str())?.strip_prefix('.')?.parse().ok()
    }

    /// Beyond the newest `max_files` files.
    fn stale(&self, index: u64) -> bool {
        index + self.max_files <= self.index
    }

    /// Bytes that could not be written (full disk, missing directory, refused file, ...).
    pub fn dropped_bytes(&self) -> u64 {
        self.dropped_bytes
    }

    /// Appends `data`, splitting it across files at the size limit.
    pub fn write(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.file.is_none() && !self.open_current() {
                self.dropped_bytes += data.len() as u64;
                return;
            }
            if self.size >= self.max_file_size {
                self.rotate();
                continue;
            }
            let room = usize::try_from(self.max_file_size - self.size).unwrap_or(usize::MAX);
            let chunk = &data[..data.len().min(room)];
            let Some(file) = self.file.as_mut() else { continue };
            if file.write_all(chunk).is_err() {
                // Part of the chunk may have landed; reopening re-reads the real size.
                self.file = None;
                self.dropped_bytes += data.len() as u64;
                return;
            }
            self.size += chunk.len() as u64;
            data = &data[chunk.len()..];
        }
    }

    fn log_dir(&self) -> Result<Beneath, FsError> {
        match self.alloc_dir.open_dir(&self.dir, Links::Refuse) {
            Err(e) if e.is_not_found() => self.alloc_dir.create_dir_all(&self.dir, LOG_DIR_MODE),
            other => other,
        }
    }

    fn open_current(&mut self) -> bool {
        let name = self.name_of(self.index);
        let opened = self.log_dir().and_then(|logs| logs.append_log(&name, LOG_FILE_MODE));
        match opened {
            Ok(file) => {
                self.size = file.metadata().map(|m| m.len()).unwrap_or(0);
                self.file = Some(file);
                self.last_error = None;
                true
            }
            Err(e) => {
                let message = e.to_string();
                if self.last_error.as_deref() != Some(message.as_str()) {
                    eprintln!("nomad-rs-executor: dropping task output: {message}");
                    self.last_error = Some(message);
                }
                false
            }
        }
    }

    fn rotate(&mut self) {
        self.file = None;
        self.index += 1;
        self.size = 0;
        // The one file that just fell out of the newest `max_files`.
        if let Some(stale) = self.index.checked_sub(self.max_files)
            && let Ok(logs) = self.alloc_dir.open_dir(&self.dir, Links::Refuse)
        {
            let _ = logs.remove_file(Path::new(&self.name_of(stale)));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    /// An alloc dir with `alloc/logs`; returns it and the logs dir.
    fn alloc_dir() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("alloc/logs");
        fs::create_dir_all(&logs).unwrap();
        (dir, logs)
    }

    fn log(dir: &tempfile::TempDir, base: &str, max_files: u32, max_file_size: u64) -> RotatingLog {
        RotatingLog::new(Beneath::open(dir.path()).unwrap(), Path::new("alloc/logs"), base, max_files, max_file_size)
    }

    /// A root-only 0600 file outside the alloc dir, standing for `/etc/shadow`.
    fn victim(dir: &Path) -> PathBuf {
        let victim = dir.join("shadow");
        fs::write(&victim, b"root:secret\n").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
        victim
    }

    #[test]
    fn rotates_at_the_size_limit_and_keeps_max_files() {
        let (dir, logs) = alloc_dir();
        let mut log = log(&dir, "web.stdout", 2, 4);
        log.write(b"0123456789ab");
        // 12 bytes in 4-byte files → indexes 0,1,2; only the newest two remain.
        assert_eq!(files(&logs), vec!["web.stdout.1", "web.stdout.2"]);
        assert_eq!(fs::read(logs.join("web.stdout.1")).unwrap(), b"4567");
        assert_eq!(fs::read(logs.join("web.stdout.2")).unwrap(), b"89ab");
    }

    #[test]
    fn resumes_after_the_highest_existing_index_and_drops_what_is_beyond_max_files() {
        let (dir, logs) = alloc_dir();
        fs::write(logs.join("t.stderr.3"), b"ab").unwrap();
        fs::write(logs.join("t.stderr.1"), b"old").unwrap();
        fs::write(logs.join("t.stdout.1"), b"other stream").unwrap();
        let mut log = log(&dir, "t.stderr", 2, 4);
        log.write(b"cdef");
        assert_eq!(fs::read(logs.join("t.stderr.3")).unwrap(), b"abcd");
        assert_eq!(fs::read(logs.join("t.stderr.4")).unwrap(), b"ef");
        assert_eq!(files(&logs), vec!["t.stderr.3", "t.stderr.4", "t.stdout.1"]);
    }

    #[test]
    fn an_unwritable_directory_counts_dropped_bytes_instead_of_failing() {
        let (dir, logs) = alloc_dir();
        fs::remove_dir(&logs).unwrap();
        fs::write(&logs, b"").unwrap(); // a file where the directory should be
        let mut log = log(&dir, "t.stdout", 3, 100);
        log.write(b"hello");
        log.write(b"again");
        assert_eq!(log.dropped_bytes(), 10);
    }

    #[test]
    fn a_vanished_log_dir_is_made_again() {
        let (dir, logs) = alloc_dir();
        let mut log = log(&dir, "t.stdout", 3, 100);
        fs::remove_dir(&logs).unwrap();
        log.write(b"back");
        assert_eq!(fs::read(logs.join("t.stdout.0")).unwrap(), b"back");
        assert_eq!(fs::metadata(&logs).unwrap().permissions().mode() & 0o777, 0o777);
    }

    #[test]
    fn a_symlink_planted_as_the_log_is_never_written_through_and_the_next_write_recovers() {
        let (dir, logs) = alloc_dir();
        let victim = victim(dir.path());
        std::os::unix::fs::symlink(&victim, logs.join("t.stdout.0")).unwrap();
        let mut log = log(&dir, "t.stdout", 3, 1 << 20);
        log.write(b"lost");
        assert_eq!(log.dropped_bytes(), 4);
        assert_eq!(fs::read(&victim).unwrap(), b"root:secret\n");
        fs::remove_file(logs.join("t.stdout.0")).unwrap();
        log.write(b"kept");
        assert_eq!(fs::read(logs.join("t.stdout.0")).unwrap(), b"kept");
    }

    #[test]
    fn rotation_never_writes_into_a_symlink_fifo_or_hard_link_planted_ahead_of_it() {
        let (dir, logs) = alloc_dir();
        let victim = victim(dir.path());
        let mut log = log(&dir, "t.stdout", 10, 4);
        // Planted by the task while it runs, at the indexes rotation opens next.
        std::os::unix::fs::symlink(&victim, logs.join("t.stdout.1")).unwrap();
        nix::unistd::mkfifo(&logs.join("t.stdout.2"), nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let other = dir.path().join("alloc/other");
        fs::write(&other, b"not a log").unwrap();
        fs::hard_link(&other, logs.join("t.stdout.3")).unwrap();
        log.write(b"0123"); // fills index 0
        log.write(b"4567"); // rotates to 1: a symlink
        assert_eq!(log.dropped_bytes(), 4);
        assert_eq!(fs::read(&victim).unwrap(), b"root:secret\n");
        // The task's file is removed; the next open still refuses a FIFO, without hanging.
        fs::remove_file(logs.join("t.stdout.1")).unwrap();
        log.write(b"89ab");
        assert_eq!(fs::read(logs.join("t.stdout.1")).unwrap(), b"89ab");
        log.write(b"cdef"); // index 2: the FIFO
        assert_eq!(log.dropped_bytes(), 8);
        fs::remove_file(logs.join("t.stdout.2")).unwrap();
        log.write(b"ghij");
        log.write(b"klmn"); // index 3: a second name of another file
        assert_eq!(log.dropped_bytes(), 12);
        assert_eq!(fs::read(&other).unwrap(), b"not a log");
    }

    #[test]
    fn a_log_dir_swapped_for_a_symlink_is_not_followed() {
        let (dir, logs) = alloc_dir();
        let outside = tempfile::tempdir().unwrap();
        let mut log = log(&dir, "t.stdout", 3, 4);
        log.write(b"0123");
        fs::rename(&logs, dir.path().join("alloc/moved")).unwrap();
        std::os::unix::fs::symlink(outside.path(), &logs).unwrap();
        log.write(b"4567"); // rotation opens a new file: refused
        assert_eq!(log.dropped_bytes(), 4);
        assert!(files(outside.path()).is_empty());
    }

    #[test]
    fn removing_an_old_file_unlinks_a_planted_symlink_not_its_target() {
        let (dir, logs) = alloc_dir();
        let victim = victim(dir.path());
        let mut log = log(&dir, "t.stdout", 1, 4);
        log.write(b"0123");
        fs::remove_file(logs.join("t.stdout.0")).unwrap();
        std::os::unix::fs::symlink(&victim, logs.join("t.stdout.0")).unwrap();
        log.write(b"4567"); // rotates to 1, removing 0
        assert_eq!(files(&logs), vec!["t.stdout.1"]);
        assert_eq!(fs::read(&victim).unwrap(), b"root:secret\n");
    }

    #[test]
    fn a_full_disk_drops_and_recovers() {
        nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Root); // to mount a small tmpfs
        let (dir, logs) = alloc_dir();
        nix::mount::mount(Some("tmpfs"), &logs, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=8k")).unwrap();
        let filler = logs.join("filler");
        // Fill the tmpfs to the last block.
        let mut f = fs::File::create(&filler).unwrap();
        while f.write_all(&[0u8; 1024]).is_ok() {}
        drop(f);
        let mut log = log(&dir, "t.stdout", 3, 1 << 20);
        log.write(&[b'x'; 8192]);
        let dropped = log.dropped_bytes();
        fs::remove_file(&filler).unwrap();
        log.write(b"kept");
        let kept = fs::read(logs.join("t.stdout.0"));
        nix::mount::umount2(&logs, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert!(dropped > 0, "a full disk drops bytes");
        assert!(kept.unwrap().ends_with(b"kept"), "and the next write lands once there is room");
    }
}
