//! `nomad-rs var init [-out hcl|json] [-quiet] [<file>]`: writes an example variable
//! specification (`spec.nv.hcl` or `spec.nv.json`) for `var put @<file>`; never overwrites.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use clap::Args;

use super::wrap;
use crate::cli::{CmdResult, Failure, exit};

/// The HCL file written when none is named (Nomad's name).
pub const DEFAULT_HCL_NAME: &str = "spec.nv.hcl";
/// The JSON file written when none is named (Nomad's name).
pub const DEFAULT_JSON_NAME: &str = "spec.nv.json";

/// The HCL example: the same fields and items as Nomad's.
pub const HCL_SPEC: &str = r#"# The path of the variable. It may be set here, or given to "var put" as its
# first argument (which wins), or taken from the URL when this file is sent to
# the /v1/var/ HTTP API.
# path = "path/to/variable"

# The namespace to write the variable in. The "-namespace" flag of "var put"
# overrides it.
# namespace = "default"

# The items are the only part a specification must have: the path and the
# namespace can come from elsewhere. They hold the secret material, which the
# servers encrypt and decrypt as one unit.

# Keys may contain dots, but templates reach dotless keys more easily; avoid
# dotted keys where you can.
items {
  key1 = "value 1"
  key2 = "value 2"
}
"#;

/// The JSON example (Nomad's).
pub const JSON_SPEC: &str = r#"{
  "Namespace": "default",
  "Path": "path/to/variable",
  "Items": {
    "key1": "value 1",
    "key2": "value 2"
  }
}
"#;

/// Nomad's note after writing a JSON specification (stdout).
const MSG_ONLY_ITEMS_REQUIRED: &str = "The Items map is the only strictly required part of a variable specification, since path and namespace can be set via other means. It contains the sensitive material to encrypt and store as a Nomad variable. The entire Items map is encrypted and decrypted as a single unit.";
/// Nomad's reminder after writing a JSON specification (stderr).
const MSG_WARN_KEYS: &str = "REMINDER: While keys in the Items map can contain dots, using them in templates is easier when they do not. As a best practice, avoid dotted keys when possible.";

/// Flags of `var init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Format of the specification: hcl or json.
    #[arg(long, value_name = "FORMAT", default_value = "hcl")]
    pub out: String,
    /// Do not print the success message.
    #[arg(long)]
    pub quiet: bool,
    /// The file to write (default spec.nv.hcl or spec.nv.json).
    #[arg(value_name = "FILE")]
    pub file: Option<String>,
}

/// Runs `var init`.
pub fn run(args: InitArgs) -> CmdResult {
    let (default_name, text) = match args.out.as_str() {
        "hcl" => (DEFAULT_HCL_NAME, HCL_SPEC),
        "json" => (DEFAULT_JSON_NAME, JSON_SPEC),
        _ => return Err(Failure::new("Invalid value for \"-out\"; valid values are [hcl, json]")),
    };
    let name = args.file.unwrap_or_else(|| default_name.to_string());
    // create_new: an existing file is never overwritten, even one that appears meanwhile.
    let mut file = match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o660).open(&name) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(Failure::new(format!("File {name:?} already exists"))),
        Err(e) => return Err(Failure::new(format!("Failed to write {name:?}: {e}"))),
    };
    file.write_all(text.as_bytes()).map_err(|e| Failure::new(format!("Failed to write {name:?}: {e}")))?;
    if !args.quiet {
        if args.out == "json" {
            println!("{}", wrap(MSG_ONLY_ITEMS_REQUIRED, 70).join("\n"));
            eprintln!("{}", wrap(MSG_WARN_KEYS, 70).join("\n"));
        }
        println!("Example variable specification written to {name}");
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::var::spec::{parse_hcl_spec, parse_json_spec};

    #[test]
    fn both_examples_are_specifications_var_put_reads() {
        let hcl = parse_hcl_spec(HCL_SPEC).unwrap();
        let json = parse_json_spec(JSON_SPEC).unwrap();
        assert_eq!(hcl.items, json.items);
        assert_eq!(hcl.items.get("key1").map(String::as_str), Some("value 1"));
        assert_eq!((json.namespace.as_str(), json.path.as_str()), ("default", "path/to/variable"));
        assert!(HCL_SPEC.lines().all(|l| l.len() <= 80));
    }

    #[test]
    fn writes_the_file_once_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.nv.json").display().to_string();
        let init = |out: &str| run(InitArgs { out: out.into(), quiet: true, file: Some(file.clone()) });
        assert_eq!(init("json"), Ok(exit::OK));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), JSON_SPEC);
        assert_eq!(init("hcl").unwrap_err().message, format!("File {file:?} already exists"));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), JSON_SPEC, "untouched");
        assert!(init("yaml").unwrap_err().message.contains("valid values are [hcl, json]"));
    }
}
