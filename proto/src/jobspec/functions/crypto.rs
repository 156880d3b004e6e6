//! Hashes and `rsadecrypt` (go-cty-funcs): hex digests of the string's
//! UTF-8 bytes, bcrypt in Go's `$2a$` form, PKCS #1 v1.5 decryption.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hcl::Value;
use md5::Digest;
use rsa::pkcs1::DecodeRsaPrivateKey;

use super::{arity, string_arg, strings, whole};

/// bcrypt's cost when none is given (Go's `bcrypt.DefaultCost`).
pub(super) const DEFAULT_BCRYPT_COST: i64 = 10;
/// Highest bcrypt cost nomad-rs runs: each step doubles the work, and cost 15 already takes
/// seconds; Go allows 31 (days), which would stall a parse.
pub(super) const MAX_BCRYPT_COST: i64 = 15;

pub(super) fn call(name: &str, args: &[Value]) -> Result<Value, String> {
    match name {
        "md5" => hex_digest::<md5::Md5>(args),
        "sha1" => hex_digest::<sha1::Sha1>(args),
        "sha256" => hex_digest::<sha2::Sha256>(args),
        "sha512" => hex_digest::<sha2::Sha512>(args),
        "bcrypt" => {
            if args.len() > 2 {
                return Err("bcrypt() takes no more than two arguments".to_string());
            }
            arity(args, 1, 2)?;
            let password = string_arg(&args[0])?;
            let mut cost = match args.get(1) {
                Some(c) => whole(c)?,
                None => DEFAULT_BCRYPT_COST,
            };
            // Go's GenerateFromPassword uses the default for a cost below the minimum.
            if cost < 4 {
                cost = DEFAULT_BCRYPT_COST;
            }
            if cost > 31 {
                return Err(format!("error occured generating password crypto/bcrypt: cost {cost} is outside allowed range (4,31)"));
            }
            if cost > MAX_BCRYPT_COST {
                return Err(format!("cost {cost} is above {MAX_BCRYPT_COST}, the highest nomad-rs computes while parsing a job"));
            }
            // Like Go's bcrypt (before x/crypto 0.15), only the first 72 bytes count.
            let bytes = &password.as_bytes()[..password.len().min(72)];
            let hash = bcrypt::hash_with_result(bytes, cost as u32).map_err(|e| format!("error occured generating password {e}"))?;
            Ok(Value::String(hash.format_for_version(bcrypt::Version::TwoA)))
        }
        "rsadecrypt" => {
            let [ciphertext, key] = strings::<2>(args)?;
            let bytes = STANDARD
                .decode(ciphertext.as_bytes())
                .map_err(|_| format!("failed to decode input \"{ciphertext}\": cipher text must be base64-encoded"))?;
            if !key.contains("-----BEGIN") {
                return Err("failed to parse key: no key found".to_string());
            }
            if key.contains("Proc-Type: 4,ENCRYPTED") {
                return Err(
                    "failed to parse key: password protected keys are not supported. Please decrypt the key prior to use".to_string()
                );
            }
            let key = rsa::PrivateKey::from_pkcs1_pem(key.trim()).map_err(|e| format!("x509: failed to parse private key: {e}"))?;
            let plain = key.decrypt(rsa::Pkcs1v15Encrypt, &bytes).map_err(|e| format!("crypto/rsa: {e}"))?;
            String::from_utf8(plain).map(Value::String).map_err(|_| "the decrypted text is not valid UTF-8".to_string())
        }
        _ => unreachable!("{name} is not a crypto function"),
    }
}

fn hex_digest<D: Digest>(args: &[Value]) -> Result<Value, String> {
    let [s] = strings::<1>(args)?;
    let digest = D::digest(s.as_bytes());
    Ok(Value::String(digest.iter().map(|b| format!("{b:02x}")).collect()))
}
