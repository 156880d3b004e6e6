//! Size-rotated task log files, named as Nomad names them: `<task>.stdout.<N>`.
//!
//! The index only grows; when the current file is full the next index is opened and the file
//! `max_files` indexes back is removed. Writing never fails the caller: a full disk or a vanished
//! directory drops the bytes, counts them, and the next write tries again.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// One stream's rotating log (stdout or stderr).
#[derive(Debug)]
pub struct RotatingLog {
    dir: PathBuf,
    /// `<task>.stdout` or `<task>.stderr`.
    base: String,
    max_files: u64,
    max_file_size: u64,
    index: u64,
    size: u64,
    file: Option<File>,
    dropped_bytes: u64,
}

impl RotatingLog {
    /// Continues after the highest existing index, so a restarted task appends to its logs.
    pub fn new(dir: &Path, base: &str, max_files: u32, max_file_size: u64) -> RotatingLog {
        let index = existing_indexes(dir, base).into_iter().max().unwrap_or(0);
        RotatingLog {
            dir: dir.to_path_buf(),
            base: base.to_string(),
            max_files: u64::from(max_files.max(1)),
            max_file_size: max_file_size.max(1),
            index,
            size: 0,
            file: None,
            dropped_bytes: 0,
        }
    }

    /// Path of the file with this index.
    pub fn path_of(&self, index: u64) -> PathBuf {
        self.dir.join(format!("{}.{index}", self.base))
    }

    /// Bytes that could not be written (full disk, missing directory, ...).
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

    fn open_current(&mut self) -> bool {
        let path = self.path_of(self.index);
        let opened = OpenOptions::new().create(true).append(true).open(&path).or_else(|_| {
            let _ = fs::create_dir_all(&self.dir);
            OpenOptions::new().create(true).append(true).open(&path)
        });
        match opened {
            Ok(file) => {
                self.size = file.metadata().map(|m| m.len()).unwrap_or(0);
                self.file = Some(file);
                true
            }
            Err(_) => false,
        }
    }

    fn rotate(&mut self) {
        self.file = None;
        self.index += 1;
        self.size = 0;
        // Everything at or below this index is beyond `max_files`.
        if let Some(stale_up_to) = (self.index + 1).checked_sub(self.max_files + 1) {
            for index in existing_indexes(&self.dir, &self.base) {
                if index <= stale_up_to {
                    let _ = fs::remove_file(self.path_of(index));
                }
            }
        }
    }
}

fn existing_indexes(dir: &Path, base: &str) -> Vec<u64> {
    let prefix = format!("{base}.");
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    entries.filter_map(|e| e.ok()).filter_map(|e| e.file_name().to_str()?.strip_prefix(&prefix)?.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    #[test]
    fn rotates_at_the_size_limit_and_keeps_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RotatingLog::new(dir.path(), "web.stdout", 2, 4);
        log.write(b"0123456789ab");
        // 12 bytes in 4-byte files → indexes 0,1,2; only the newest two remain.
        assert_eq!(files(dir.path()), vec!["web.stdout.1", "web.stdout.2"]);
        assert_eq!(fs::read(dir.path().join("web.stdout.1")).unwrap(), b"4567");
        assert_eq!(fs::read(dir.path().join("web.stdout.2")).unwrap(), b"89ab");
    }

    #[test]
    fn resumes_after_the_highest_existing_index() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("t.stderr.3"), b"ab").unwrap();
        let mut log = RotatingLog::new(dir.path(), "t.stderr", 5, 4);
        log.write(b"cdef");
        assert_eq!(fs::read(dir.path().join("t.stderr.3")).unwrap(), b"abcd");
        assert_eq!(fs::read(dir.path().join("t.stderr.4")).unwrap(), b"ef");
    }

    #[test]
    fn an_unwritable_directory_counts_dropped_bytes_instead_of_failing() {
        let dir = tempfile::tempdir().unwrap();
        let blocked = dir.path().join("not-a-dir");
        fs::write(&blocked, b"").unwrap();
        let mut log = RotatingLog::new(&blocked, "t.stdout", 3, 100);
        log.write(b"hello");
        log.write(b"again");
        assert_eq!(log.dropped_bytes(), 10);
    }

    #[test]
    fn a_full_disk_drops_and_recovers() {
        // /dev/full fails every write with ENOSPC, like a full disk.
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/dev/full", dir.path().join("t.stdout.0")).unwrap();
        let mut log = RotatingLog::new(dir.path(), "t.stdout", 3, 1 << 20);
        log.write(b"lost");
        assert_eq!(log.dropped_bytes(), 4);
        fs::remove_file(dir.path().join("t.stdout.0")).unwrap();
        log.write(b"kept");
        assert_eq!(fs::read(dir.path().join("t.stdout.0")).unwrap(), b"kept");
    }
}
