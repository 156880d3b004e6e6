//! Memory: `memory.totalbytes`.

use super::{Fingerprint, FingerprintContext, Fingerprinter, read};

pub(super) struct Memory;

/// `MemTotal` from `/proc/meminfo`, in bytes.
fn parse_meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl Fingerprinter for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn fingerprint(&self, _ctx: &FingerprintContext, out: &mut Fingerprint) -> Result<(), String> {
        let bytes = parse_meminfo_total(&read("/proc/meminfo")?).ok_or("no MemTotal in /proc/meminfo")?;
        out.memory_mb = (bytes / 1024 / 1024) as i64;
        out.attributes.insert("memory.totalbytes".into(), bytes.to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_total_is_in_bytes() {
        assert_eq!(parse_meminfo_total("MemTotal:       16384 kB\nMemFree: 1 kB\n"), Some(16384 * 1024));
        assert_eq!(parse_meminfo_total("MemFree: 1 kB\n"), None);
    }
}
