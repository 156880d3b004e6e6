//! Kernel: `kernel.name`, `kernel.version`, `kernel.arch`.

use super::{Fingerprint, FingerprintContext, Fingerprinter};

pub(super) struct Kernel;

/// `uname(2)`: (sysname, release, machine).
fn uname() -> Result<(String, String, String), String> {
    // SAFETY: utsname is plain data; uname fills it with NUL-terminated strings.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return Err(format!("uname: {}", std::io::Error::last_os_error()));
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Ok((field(&u.sysname), field(&u.release), field(&u.machine)))
}

impl Fingerprinter for Kernel {
    fn name(&self) -> &'static str {
        "kernel"
    }

    fn fingerprint(&self, _ctx: &FingerprintContext, out: &mut Fingerprint) -> Result<(), String> {
        let (sysname, release, machine) = uname()?;
        // Nomad reports Go's GOOS here: lower case.
        out.attributes.insert("kernel.name".into(), sysname.to_lowercase());
        out.attributes.insert("kernel.version".into(), release);
        out.attributes.insert("kernel.arch".into(), machine);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_is_linux() {
        let mut out = Fingerprint::default();
        let ctx = FingerprintContext { alloc_dir: "/".into(), advertise_ip: None, http_addr: String::new(), network_interface: None };
        Kernel.fingerprint(&ctx, &mut out).unwrap();
        assert_eq!(out.attributes["kernel.name"], "linux");
        assert!(!out.attributes["kernel.version"].is_empty());
        assert_eq!(out.attributes["kernel.arch"], std::env::consts::ARCH);
    }
}
