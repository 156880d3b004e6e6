//! Artifact checksums: `md5`, `sha1`, `sha256` or `sha512`, checked on the downloaded file
//! (the archive, before unpacking) as go-getter does.

use std::io::Read;

use sha2::Digest;

/// A hash function of a checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// MD5.
    Md5,
    /// SHA-1.
    Sha1,
    /// SHA-256.
    Sha256,
    /// SHA-512.
    Sha512,
}

impl Kind {
    fn named(name: &str) -> Option<Kind> {
        match name {
            "md5" => Some(Kind::Md5),
            "sha1" => Some(Kind::Sha1),
            "sha256" => Some(Kind::Sha256),
            "sha512" => Some(Kind::Sha512),
            _ => None,
        }
    }

    /// go-getter guesses the type of an untyped checksum from its length.
    fn by_len(len: usize) -> Option<Kind> {
        [Kind::Md5, Kind::Sha1, Kind::Sha256, Kind::Sha512].into_iter().find(|k| k.len() == len)
    }

    fn len(self) -> usize {
        match self {
            Kind::Md5 => 16,
            Kind::Sha1 => 20,
            Kind::Sha256 => 32,
            Kind::Sha512 => 64,
        }
    }

    /// Go's `%T` of the hash, which go-getter's mismatch message ends with.
    fn go_type(self) -> &'static str {
        match self {
            Kind::Md5 => "*md5.digest",
            Kind::Sha1 => "*sha1.digest",
            Kind::Sha256 => "*sha256.digest",
            Kind::Sha512 => "*sha512.digest",
        }
    }
}

/// What a file must hash to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum {
    /// The hash function.
    pub kind: Kind,
    /// The digest expected.
    pub expected: Vec<u8>,
}

/// A running hash.
pub enum Hasher {
    /// MD5.
    Md5(md5::Md5),
    /// SHA-1.
    Sha1(sha1::Sha1),
    /// SHA-256.
    Sha256(sha2::Sha256),
    /// SHA-512.
    Sha512(sha2::Sha512),
}

impl Hasher {
    /// Adds bytes.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Md5(h) => h.update(data),
            Hasher::Sha1(h) => h.update(data),
            Hasher::Sha256(h) => h.update(data),
            Hasher::Sha512(h) => h.update(data),
        }
    }

    /// The digest.
    pub fn finish(self) -> Vec<u8> {
        match self {
            Hasher::Md5(h) => h.finalize().to_vec(),
            Hasher::Sha1(h) => h.finalize().to_vec(),
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::Sha512(h) => h.finalize().to_vec(),
        }
    }
}

impl Checksum {
    /// `type:hex`, or a bare hex digest whose length says its type (go-getter's rules, without
    /// its `file:` form, which Nomad's validation refuses too).
    pub fn parse(s: &str) -> Result<Checksum, String> {
        let s = s.trim();
        let (kind, hex) = match s.split_once(':') {
            Some(("file", _)) => return Err("checksums from a file (file:<url>) are not supported".into()),
            Some((name, hex)) => (Kind::named(name).ok_or_else(|| format!("unsupported checksum type: {name}"))?, hex),
            None => (Kind::by_len(s.len() / 2).ok_or_else(|| format!("unknown type for checksum {s}"))?, s),
        };
        let expected = nomad_proto::validate::decode_hex(hex)?;
        if expected.len() != kind.len() {
            return Err(format!("invalid {} checksum: {hex}", format!("{kind:?}").to_lowercase()));
        }
        Ok(Checksum { kind, expected })
    }

    /// A fresh hash of this kind.
    pub fn hasher(&self) -> Hasher {
        match self.kind {
            Kind::Md5 => Hasher::Md5(md5::Md5::new()),
            Kind::Sha1 => Hasher::Sha1(sha1::Sha1::new()),
            Kind::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            Kind::Sha512 => Hasher::Sha512(sha2::Sha512::new()),
        }
    }

    /// go-getter's `ChecksumError` when `actual` differs; `file` names what was hashed.
    pub fn verify(&self, actual: &[u8], file: &str) -> Result<(), String> {
        if actual == self.expected.as_slice() {
            return Ok(());
        }
        Err(format!(
            "Checksums did not match for {file}.\nExpected: {}\nGot: {}\n{}",
            hex(&self.expected),
            hex(actual),
            self.kind.go_type()
        ))
    }

    /// Whether everything `r` yields hashes to the expected digest.
    pub fn matches(&self, mut r: impl Read) -> std::io::Result<bool> {
        let mut h = self.hasher();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        Ok(h.finish() == self.expected)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_checked_and_a_mismatch_reads_like_go_getters() {
        let data = b"hello\n";
        for (spec, kind) in [
            ("md5:b1946ac92492d2347c6235b4d2611184", Kind::Md5),
            ("sha1:f572d396fae9206628714fb2ce00f72e94f2258f", Kind::Sha1),
            ("sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03", Kind::Sha256),
            (
                "sha512:e7c22b994c59d9cf2b48e549b1e24666636045930d3da7c1acb299d1c3b7f931f94aae41edda2c2b207a36e10f8bcb8d45223e54878f5b316e7ce3b6bc019629",
                Kind::Sha512,
            ),
        ] {
            let c = Checksum::parse(spec).unwrap();
            assert_eq!(c.kind, kind);
            assert!(c.matches(&data[..]).unwrap(), "{spec}");
            let mut h = c.hasher();
            h.update(data);
            c.verify(&h.finish(), "local/f").unwrap();
            assert!(!c.matches(&b"other"[..]).unwrap());
        }
        let c = Checksum::parse("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03").unwrap();
        assert_eq!(c.kind, Kind::Sha256, "a bare digest's length says its type");
        let e = c.verify(&[0xab; 32], "local/f").unwrap_err();
        assert_eq!(
            e,
            format!(
                "Checksums did not match for local/f.\nExpected: 5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03\nGot: {}\n*sha256.digest",
                "ab".repeat(32)
            )
        );
        assert_eq!(Checksum::parse("crc:00").unwrap_err(), "unsupported checksum type: crc");
        assert_eq!(Checksum::parse("md5:00").unwrap_err(), "invalid md5 checksum: 00");
        assert!(Checksum::parse("file:https://x/SUMS").unwrap_err().contains("not supported"));
    }
}
