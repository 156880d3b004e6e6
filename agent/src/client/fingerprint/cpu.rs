//! CPU: `cpu.numcores`, `cpu.frequency` (MHz), `cpu.totalcompute`, `cpu.arch`, `cpu.modelname`.

use super::{Fingerprint, FingerprintContext, Fingerprinter, read};

pub(super) struct Cpu;

/// What `/proc/cpuinfo` says.
#[derive(Debug, Default, PartialEq)]
struct CpuInfo {
    processors: u16,
    model_name: Option<String>,
    mhz: Option<f64>,
}

fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut info = CpuInfo::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => info.processors += 1,
            "model name" if info.model_name.is_none() => info.model_name = Some(value.to_string()),
            // The fastest core's current speed: the best guess without cpufreq.
            "cpu MHz" => {
                if let Ok(mhz) = value.parse::<f64>() {
                    info.mhz = Some(info.mhz.map_or(mhz, |m| m.max(mhz)));
                }
            }
            _ => {}
        }
    }
    info
}

/// Go's name for the architecture, which is what jobs constrain on (`amd64`, `arm64`).
pub(super) fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

impl Fingerprinter for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn fingerprint(&self, _ctx: &FingerprintContext, out: &mut Fingerprint) -> Result<(), String> {
        out.attributes.insert("cpu.arch".into(), go_arch().into());
        let info = parse_cpuinfo(&read("/proc/cpuinfo").unwrap_or_default());
        let cores = std::thread::available_parallelism().map(|n| n.get() as u16).unwrap_or(info.processors).max(1);
        // The rated maximum when cpufreq exposes it (kHz); the current speed otherwise.
        let max_khz = read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").ok().and_then(|s| s.trim().parse::<i64>().ok());
        let mhz = max_khz.map(|k| k / 1000).or(info.mhz.map(|m| m.round() as i64)).filter(|m| *m > 0).unwrap_or(1000);
        out.cpu_cores = cores;
        out.cpu_mhz = mhz;
        out.attributes.insert("cpu.numcores".into(), cores.to_string());
        out.attributes.insert("cpu.frequency".into(), mhz.to_string());
        out.attributes.insert("cpu.totalcompute".into(), (mhz * i64::from(cores)).to_string());
        if let Some(model) = info.model_name {
            out.attributes.insert("cpu.modelname".into(), model);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuinfo_gives_cores_model_and_the_fastest_speed() {
        let text = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\ncpu MHz\t\t: 2199.998\n\n\
                    processor\t: 1\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\ncpu MHz\t\t: 2400.5\n";
        let info = parse_cpuinfo(text);
        assert_eq!(info.processors, 2);
        assert_eq!(info.model_name.as_deref(), Some("Intel(R) Xeon(R) CPU @ 2.20GHz"));
        assert_eq!(info.mhz, Some(2400.5));
    }

    #[test]
    fn the_host_fingerprint_is_consistent() {
        let mut out = Fingerprint::default();
        let ctx = FingerprintContext { alloc_dir: "/".into(), advertise_ip: None, http_addr: String::new(), network_interface: None };
        Cpu.fingerprint(&ctx, &mut out).unwrap();
        let total: i64 = out.attributes["cpu.totalcompute"].parse().unwrap();
        assert_eq!(total, out.cpu_mhz * i64::from(out.cpu_cores));
        assert!(out.cpu_cores >= 1 && out.cpu_mhz > 0);
    }
}
