//! Volume specification files (`nomad volume register|create <file>`) to [`CsiVolume`].
//!
//! Nomad 1.6 reads these with HCL1 (`command/volume_register_csi.go`), in HCL or JSON syntax;
//! the keys are those of its volume specification: `id name namespace type external_id
//! plugin_id snapshot_id clone_id capacity_min capacity_max capability mount_options
//! topology_request secrets parameters context`. Here the HCL is read with the job parser's
//! reader (hcl-edit), so errors carry file:line:column, and every key is checked: anything
//! else is an error naming it (Nomad's mapstructure decoding drops unknown keys silently).
//!
//! JSON files use the same snake_case keys, in HCL1's JSON shape: an object under a block key
//! (`capability`, `mount_options`, `topology_request`, `required`, `preferred`, `topology`) is
//! one block, a list of objects is one block each. They are turned into the same syntax tree
//! and decoded by the same code, so both forms accept exactly the same things; only syntax
//! errors of JSON files have a line and column.
//!
//! Only `type = "csi"` exists: Nomad 1.6 has no other kind of volume to register or create
//! (host volumes are the client's `host_volume` configuration, not an API object).

use hcl::Value;
use hcl::edit::structure::{Attribute, Block, Body, Structure};
use hcl::edit::{Ident, Span};

use super::error::{Diag, ErrorKind, JobspecError, Position};
use super::eval::{Evaluator, Scope, as_string, integer_of};
use super::reader::{BlockRef, Reader};
use crate::csi::{CsiTopology, CsiTopologyRequest, CsiVolume, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeCapability};
use crate::volume::CsiMountOptions;

/// Largest volume specification parsed, in bytes (checked before parsing). A volume's maps
/// (`secrets`, `parameters`, `context`, each topology's `segments`) may hold up to
/// [`crate::limits::MAX_META_TOTAL_BYTES`] each on the servers; a few of them fit well within
/// this, and a file this large is not a volume anybody writes by hand.
pub const MAX_VOLUME_SPEC_BYTES: usize = 4 * 1024 * 1024;

/// Keys whose JSON objects are blocks, as HCL1's JSON parser makes them.
const BLOCK_KEYS: &[&str] = &["capability", "mount_options", "topology_request", "required", "preferred", "topology"];

/// Parses a volume specification (HCL, or JSON when the text starts with `{`). `filename`
/// names the file in errors (`<volume>` when empty).
pub fn parse(src: &str, filename: &str) -> Result<CsiVolume, JobspecError> {
    let file = if filename.is_empty() { "<volume>" } else { filename };
    if src.len() > MAX_VOLUME_SPEC_BYTES {
        return Err(JobspecError {
            kind: ErrorKind::Structure,
            file: file.to_string(),
            position: None,
            message: format!("the file is {} bytes; a volume specification may be at most {MAX_VOLUME_SPEC_BYTES}", src.len()),
        });
    }
    let body = if src.trim_start().starts_with('{') {
        json_body_of(file, src)?
    } else {
        super::parse_hcl(file, src).map_err(|e| explain_hcl1(e, src))?
    };
    let eval = Evaluator::for_job_file(src);
    decode(&eval, &body).map_err(|d| d.locate(file, src))
}

/// Nomad 1.6 reads volume specifications with HCL1, and its documentation writes topologies
/// in HCL1's one-line form (`topology { segments { "rack" = "R1", zone = "z" } }`), which HCL2
/// refuses: a syntax error on such a line says how to write it.
fn explain_hcl1(mut e: JobspecError, src: &str) -> JobspecError {
    let Some(line) = e.position.and_then(|p| src.lines().nth(p.line.saturating_sub(1))) else { return e };
    let one_line_nesting = line.matches('{').count() > 1;
    let in_block = line.contains('{') && (line.contains(',') || line.contains("\" ="));
    if one_line_nesting || in_block {
        e.message.push_str(
            "; Nomad reads volume specifications with HCL1, which takes nested blocks, quoted keys and commas on one line; \
             nomad-rs reads HCL2: put each block on its own line, or write maps as segments = { rack = \"R1\", zone = \"z\" }",
        );
    }
    e
}

fn json_body_of(file: &str, src: &str) -> Result<Body, JobspecError> {
    let value: serde_json::Value = serde_json::from_str(src).map_err(|e| JobspecError {
        kind: ErrorKind::Syntax,
        file: file.to_string(),
        position: Some(Position { line: e.line(), column: e.column() }),
        message: format!("syntax error: {e}"),
    })?;
    let serde_json::Value::Object(map) = value else {
        return Err(JobspecError {
            kind: ErrorKind::Structure,
            file: file.to_string(),
            position: None,
            message: "a JSON volume specification must be an object".into(),
        });
    };
    json_body(&map, "volume").map_err(|d| d.locate(file, src))
}

/// A JSON object as a block body: block keys become blocks, everything else attributes.
fn json_body(map: &serde_json::Map<String, serde_json::Value>, context: &str) -> Result<Body, Diag> {
    let mut body = Body::new();
    for (key, value) in map {
        let ident = Ident::try_new(key.as_str())
            .map_err(|_| Diag::new(ErrorKind::UnknownKey, None, format!("unknown key {key:?} in {context}")))?;
        let inner = |m: &serde_json::Map<String, serde_json::Value>| json_body(m, &format!("{key} block of {context}"));
        match value {
            serde_json::Value::Object(m) if BLOCK_KEYS.contains(&key.as_str()) => {
                let mut block = Block::new(ident);
                block.body = inner(m)?;
                body.push(block);
            }
            serde_json::Value::Array(items)
                if BLOCK_KEYS.contains(&key.as_str()) && !items.is_empty() && items.iter().all(serde_json::Value::is_object) =>
            {
                for item in items {
                    if let serde_json::Value::Object(m) = item {
                        let mut block = Block::new(ident.clone());
                        block.body = inner(m)?;
                        body.push(block);
                    }
                }
            }
            other => {
                let v: Value = serde_json::from_value(other.clone())
                    .map_err(|e| Diag::new(ErrorKind::Type, None, format!("invalid value for {key:?} in {context}: {e}")))?;
                body.push(Structure::Attribute(Attribute::new(ident, hcl::Expression::from(v))));
            }
        }
    }
    Ok(body)
}

fn decode(eval: &Evaluator<'_>, body: &Body) -> Result<CsiVolume, Diag> {
    let top = BlockRef { ident: "volume", labels: Vec::new(), body, offset: None, scope: Scope::default() };
    let r = Reader::open(eval, &top)?;
    let volume_type = r.value("type")?;
    match &volume_type {
        None => {
            return Err(Diag::new(
                ErrorKind::Structure,
                None,
                "the volume specification has no \"type\"; Nomad 1.6 has one type of volume: type = \"csi\"",
            ));
        }
        Some((v, at)) => {
            let t = as_string(v).ok_or_else(|| r.type_mismatch("type", *at, "a string", v))?;
            match t.to_lowercase().as_str() {
                "csi" => {}
                "host" => {
                    return Err(r.invalid(
                        "type",
                        *at,
                        "unknown volume type \"host\": Nomad 1.6 registers and creates only CSI volumes (host volumes are a \
                         client's host_volume configuration); use type = \"csi\"",
                    ));
                }
                other => return Err(r.invalid("type", *at, format!("unknown volume type {other:?}; the only type is \"csi\""))),
            }
        }
    }
    for legacy in ["access_mode", "attachment_mode"] {
        if let Some(a) = r.body().iter().find_map(|s| s.as_attribute().filter(|a| a.key.as_str() == legacy)) {
            return Err(Diag::new(
                ErrorKind::UnknownKey,
                a.span().map(|s| s.start),
                format!("\"{legacy}\" belongs in a capability block of a volume specification, not at the top level"),
            ));
        }
    }
    let mut vol = CsiVolume::default();
    match r.string("id")? {
        Some(id) if !id.is_empty() => vol.id = id,
        _ => return Err(Diag::new(ErrorKind::Structure, None, "missing required attribute \"id\" in volume")),
    }
    r.set_string("name", &mut vol.name)?;
    r.set_string("namespace", &mut vol.namespace)?;
    r.set_string("external_id", &mut vol.external_id)?;
    r.set_string("plugin_id", &mut vol.plugin_id)?;
    r.set_string("snapshot_id", &mut vol.snapshot_id)?;
    r.set_string("clone_id", &mut vol.clone_id)?;
    vol.requested_capacity_min = capacity(&r, "capacity_min")?;
    vol.requested_capacity_max = capacity(&r, "capacity_max")?;
    for block in r.blocks("capability", 0)? {
        let c = r.child(&block)?;
        // Unknown keys first: a misspelt access_mode is reported as such, not as missing.
        let (access, attachment) = (c.value("access_mode")?, c.value("attachment_mode")?);
        c.finish()?;
        let access = mode(&c, "access_mode", access, &CsiVolumeAccessMode::ALL.map(|m| (m.as_str(), m)), block.offset)?;
        let attachment = mode(
            &c,
            "attachment_mode",
            attachment,
            &[("file-system", CsiVolumeAttachmentMode::FileSystem), ("block-device", CsiVolumeAttachmentMode::BlockDevice)],
            block.offset,
        )?;
        vol.requested_capabilities.push(CsiVolumeCapability { access_mode: access, attachment_mode: attachment });
    }
    if let Some(block) = r.block("mount_options")? {
        let m = r.child(&block)?;
        let mut opts = CsiMountOptions::default();
        m.set_string("fs_type", &mut opts.fs_type)?;
        m.set_strings("mount_flags", &mut opts.mount_flags)?;
        m.finish()?;
        vol.mount_options = Some(opts);
    }
    if let Some(block) = r.block("topology_request")? {
        let t = r.child(&block)?;
        let mut request = CsiTopologyRequest::default();
        if let Some(b) = t.block("required")? {
            request.required = topologies(&t, &b)?;
        }
        if let Some(b) = t.block("preferred")? {
            request.preferred = topologies(&t, &b)?;
        }
        t.finish()?;
        vol.requested_topologies = Some(request);
    }
    r.set_string_map("secrets", &mut vol.secrets)?;
    r.set_string_map("parameters", &mut vol.parameters)?;
    r.set_string_map("context", &mut vol.context)?;
    r.finish()?;
    Ok(vol)
}

/// `capacity_min`/`capacity_max`: a size with go-humanize's units (`"10GiB"`, `"200G"`), or a
/// number of bytes.
fn capacity(r: &Reader<'_>, name: &'static str) -> Result<i64, Diag> {
    let Some((v, at)) = r.value(name)? else { return Ok(0) };
    let bytes = match &v {
        Value::String(s) => parse_bytes(s),
        Value::Number(n) => integer_of(n).filter(|b| *b >= 0).ok_or_else(|| format!("{n} is not a whole number of bytes")),
        other => return Err(r.type_mismatch(name, at, "a size such as \"10GiB\"", other)),
    };
    bytes.map_err(|why| r.invalid(name, at, format!("could not parse value as bytes: {why}")))
}

/// A size as go-humanize's `ParseBytes` reads it (what Nomad uses for capacities): a number
/// (`,` separators allowed, fractions too), optional spaces, and a case-insensitive unit: none
/// or `b`, `k kb m mb g gb t tb p pb e eb` (powers of 1000), `ki kib mi mib gi gib ti tib pi pib
/// ei eib` (powers of 1024). An empty string is 0, as in Nomad.
pub fn parse_bytes(s: &str) -> Result<i64, String> {
    if s.is_empty() {
        return Ok(0);
    }
    let digits = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ',')).unwrap_or(s.len());
    let number: String = s[..digits].chars().filter(|c| *c != ',').collect();
    let value: f64 = number.parse().map_err(|_| format!("{s:?} does not start with a number"))?;
    let unit = s[digits..].trim().to_ascii_lowercase();
    let exp = |base: f64, power: i32| base.powi(power);
    let factor = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => exp(1000.0, 1),
        "m" | "mb" => exp(1000.0, 2),
        "g" | "gb" => exp(1000.0, 3),
        "t" | "tb" => exp(1000.0, 4),
        "p" | "pb" => exp(1000.0, 5),
        "e" | "eb" => exp(1000.0, 6),
        "ki" | "kib" => exp(1024.0, 1),
        "mi" | "mib" => exp(1024.0, 2),
        "gi" | "gib" => exp(1024.0, 3),
        "ti" | "tib" => exp(1024.0, 4),
        "pi" | "pib" => exp(1024.0, 5),
        "ei" | "eib" => exp(1024.0, 6),
        _ => return Err(format!("unhandled size name: {unit}")),
    };
    let bytes = value * factor;
    // i64::MAX as f64 rounds up to 2^63, so `<` keeps the cast exact.
    if !bytes.is_finite() || bytes >= i64::MAX as f64 {
        return Err(format!("too large: {s}"));
    }
    Ok(bytes as i64)
}

/// An access or attachment mode, required, one of `known`.
fn mode<T: Copy>(
    c: &Reader<'_>,
    name: &'static str,
    value: Option<(Value, Option<usize>)>,
    known: &[(&str, T)],
    block_at: Option<usize>,
) -> Result<T, Diag> {
    let Some((v, at)) = value else {
        return Err(Diag::new(ErrorKind::Structure, block_at, format!("missing required attribute \"{name}\" in {}", c.context())));
    };
    let s = as_string(&v).ok_or_else(|| c.type_mismatch(name, at, "a string", &v))?;
    known.iter().find(|(n, _)| *n == s).map(|(_, m)| *m).ok_or_else(|| {
        let names: Vec<String> = known.iter().map(|(n, _)| format!("{n:?}")).collect();
        c.invalid(name, at, format!("{s:?} is not one of {}", names.join(", ")))
    })
}

/// `required`/`preferred { topology { segments { ... } } ... }`.
fn topologies(parent: &Reader<'_>, block: &BlockRef<'_>) -> Result<Vec<CsiTopology>, Diag> {
    let r = parent.child(block)?;
    let mut out = Vec::new();
    for t in r.blocks("topology", 0)? {
        let tr = r.child(&t)?;
        let segments = tr.string_map("segments")?.unwrap_or_default();
        tr.finish()?;
        if segments.is_empty() {
            return Err(Diag::new(ErrorKind::Structure, t.offset, format!("{} needs segments with at least one entry", tr.context())));
        }
        out.push(CsiTopology { segments });
    }
    r.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
id           = "ebs_prod_db1"
namespace    = "prod"
name         = "database"
type         = "csi"
plugin_id    = "ebs-prod"
external_id  = "vol-23452345"
capacity_max = "200G"
capacity_min = "10GiB"

capability {
  access_mode     = "single-node-reader-only"
  attachment_mode = "file-system"
}

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "block-device"
}

mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime"]
}

topology_request {
  required {
    topology {
      segments {
        rack = "R2"
      }
    }
    topology {
      segments = { "rack" = "R1", "topology.kubernetes.io/zone" = "us-east-1a" }
    }
  }
}

secrets {
  example_secret = "xyzzy"
}

parameters {
  skuname = "Premium_LRS"
}

context {
  endpoint = "http://192.168.1.101:9425"
}
"#;

    #[test]
    fn the_documented_example_decodes_into_every_field() {
        let v = parse(FULL, "vol.hcl").unwrap();
        assert_eq!((v.id.as_str(), v.name.as_str(), v.namespace.as_str()), ("ebs_prod_db1", "database", "prod"));
        assert_eq!((v.plugin_id.as_str(), v.external_id.as_str()), ("ebs-prod", "vol-23452345"));
        assert_eq!(v.requested_capacity_max, 200_000_000_000);
        assert_eq!(v.requested_capacity_min, 10 * 1024 * 1024 * 1024);
        assert_eq!(
            v.requested_capabilities,
            vec![
                CsiVolumeCapability {
                    access_mode: CsiVolumeAccessMode::SingleNodeReader,
                    attachment_mode: CsiVolumeAttachmentMode::FileSystem
                },
                CsiVolumeCapability {
                    access_mode: CsiVolumeAccessMode::SingleNodeWriter,
                    attachment_mode: CsiVolumeAttachmentMode::BlockDevice
                },
            ]
        );
        assert_eq!(v.mount_options, Some(CsiMountOptions { fs_type: "ext4".into(), mount_flags: vec!["noatime".into()] }));
        let topo = v.requested_topologies.unwrap();
        assert_eq!(topo.required.len(), 2);
        assert_eq!(topo.required[1].segments["topology.kubernetes.io/zone"], "us-east-1a");
        assert!(topo.preferred.is_empty());
        assert_eq!(v.secrets["example_secret"], "xyzzy");
        assert_eq!(v.parameters["skuname"], "Premium_LRS");
        assert_eq!(v.context["endpoint"], "http://192.168.1.101:9425");
    }

    #[test]
    fn json_files_take_the_same_keys_in_hcl1s_json_shape() {
        let json = r#"{
  "id": "ebs_prod_db1", "namespace": "prod", "name": "database", "type": "csi",
  "plugin_id": "ebs-prod", "external_id": "vol-23452345",
  "capacity_max": "200G", "capacity_min": "10GiB",
  "capability": [
    {"access_mode": "single-node-reader-only", "attachment_mode": "file-system"},
    {"access_mode": "single-node-writer", "attachment_mode": "block-device"}
  ],
  "mount_options": {"fs_type": "ext4", "mount_flags": ["noatime"]},
  "topology_request": {"required": {"topology": [
    {"segments": {"rack": "R2"}},
    {"segments": {"rack": "R1", "topology.kubernetes.io/zone": "us-east-1a"}}
  ]}},
  "secrets": {"example_secret": "xyzzy"},
  "parameters": {"skuname": "Premium_LRS"},
  "context": {"endpoint": "http://192.168.1.101:9425"}
}"#;
        assert_eq!(parse(json, "vol.json").unwrap(), parse(FULL, "vol.hcl").unwrap());
        let e =
            parse(r#"{"id": "v", "type": "csi", "capability": {"access_mode": "single-node-writer", "bogus": 1}}"#, "v.json").unwrap_err();
        assert_eq!(e.to_string(), "v.json: unknown attribute \"bogus\" in capability block of volume");
        let e = parse("{\"id\": \"v\",\n  \"type\": }", "v.json").unwrap_err();
        assert_eq!(e.position, Some(Position { line: 2, column: 11 }), "{e}");
        assert!(e.to_string().starts_with("v.json:2:11: syntax error: expected value"), "{e}");
        let e = parse(r#"{"id": "v", "type": "csi", "a.b": 1}"#, "v.json").unwrap_err();
        assert_eq!(e.to_string(), "v.json: unknown key \"a.b\" in volume");
    }

    #[test]
    fn unknown_keys_are_refused_with_their_place_and_a_suggestion() {
        let e = parse("id = \"v\"\ntype = \"csi\"\nplugin = \"p\"\n", "v.hcl").unwrap_err();
        assert_eq!(e.to_string(), "v.hcl:3:1: unknown attribute \"plugin\" in volume");
        let e = parse("id = \"v\"\ntype = \"csi\"\nextrnal_id = \"p\"\n", "v.hcl").unwrap_err();
        assert_eq!(e.to_string(), "v.hcl:3:1: unknown attribute \"extrnal_id\" in volume; did you mean \"external_id\"?");
        let e = parse("id = \"v\"\ntype = \"csi\"\ncapability {\n  access_mode = \"single-node-writer\"\n  mode = 1\n}\n", "v.hcl")
            .unwrap_err();
        assert_eq!(e.to_string(), "v.hcl:5:3: unknown attribute \"mode\" in capability block of volume");
        let e = parse("id = \"v\"\ntype = \"csi\"\naccess_mode = \"single-node-writer\"\n", "v.hcl").unwrap_err();
        assert!(e.to_string().starts_with("v.hcl:3:1: \"access_mode\" belongs in a capability block"), "{e}");
        let e = parse("id = \"v\"\ntype = \"csi\"\nmount_options {\n  fs = \"x\"\n}\n", "v.hcl").unwrap_err();
        assert_eq!(e.to_string(), "v.hcl:4:3: unknown attribute \"fs\" in mount_options block of volume");
    }

    #[test]
    fn sizes_read_as_go_humanize_reads_them() {
        for (s, want) in [
            ("", 0),
            ("100", 100),
            ("1b", 1),
            ("10GiB", 10 << 30),
            ("10 gib", 10 << 30),
            ("200G", 200_000_000_000),
            ("1.5MB", 1_500_000),
            ("1,000 KiB", 1_024_000),
            ("2Ti", 2 << 40),
            ("1E", 1_000_000_000_000_000_000),
        ] {
            assert_eq!(parse_bytes(s), Ok(want), "{s:?}");
        }
        assert_eq!(parse_bytes("10 xb").unwrap_err(), "unhandled size name: xb");
        assert_eq!(parse_bytes("GiB").unwrap_err(), "\"GiB\" does not start with a number");
        assert_eq!(parse_bytes("9EiB").unwrap_err(), "too large: 9EiB");
        let e = parse("id = \"v\"\ntype = \"csi\"\ncapacity_min = \"10 xb\"\n", "v.hcl").unwrap_err();
        assert_eq!(
            e.to_string(),
            "v.hcl:3:16: invalid value for \"capacity_min\" in volume: could not parse value as bytes: unhandled size name: xb"
        );
        assert_eq!(parse("id = \"v\"\ntype = \"csi\"\ncapacity_max = 4096\n", "v.hcl").unwrap().requested_capacity_max, 4096);
    }

    #[test]
    fn id_and_the_csi_type_are_required_and_modes_checked() {
        let e = parse("type = \"csi\"\nname = \"x\"\n", "v.hcl").unwrap_err();
        assert_eq!(e.to_string(), "v.hcl: missing required attribute \"id\" in volume");
        let e = parse("id = \"v\"\n", "v.hcl").unwrap_err();
        assert!(e.to_string().contains("has no \"type\""), "{e}");
        let e = parse("id = \"v\"\ntype = \"host\"\n", "v.hcl").unwrap_err();
        assert!(e.to_string().starts_with("v.hcl:2:8: invalid value for \"type\" in volume: unknown volume type \"host\""), "{e}");
        assert_eq!(parse("id = \"v\"\ntype = \"CSI\"\n", "v.hcl").unwrap().id, "v", "the type is case-insensitive, as in Nomad");
        let e = parse("id = \"v\"\ntype = \"csi\"\ncapability {\n  access_mode = \"single-node\"\n}\n", "v.hcl").unwrap_err();
        assert!(
            e.to_string().starts_with(
                "v.hcl:4:17: invalid value for \"access_mode\" in capability block of volume: \"single-node\" is not one of \"single-node-reader-only\""
            ),
            "{e}"
        );
        let e = parse("id = \"v\"\ntype = \"csi\"\ncapability {\n  access_mode = \"single-node-writer\"\n}\n", "v.hcl").unwrap_err();
        assert_eq!(e.to_string(), "v.hcl:3:1: missing required attribute \"attachment_mode\" in capability block of volume");
        let e = parse("id = \"v\"\ntype = \"csi\"\ntopology_request {\n  required {\n    topology {}\n  }\n}\n", "v.hcl").unwrap_err();
        assert!(e.to_string().starts_with("v.hcl:5:5: topology block of volume needs segments"), "{e}");
    }

    #[test]
    fn oversized_files_are_refused_before_parsing() {
        let big = format!("id = \"v\"\ntype = \"csi\"\n#{}\n", "x".repeat(MAX_VOLUME_SPEC_BYTES));
        let e = parse(&big, "v.hcl").unwrap_err();
        assert!(e.to_string().contains("a volume specification may be at most 4194304"), "{e}");
        let e = parse("id = \"v\"\ntype = \"csi\"\nname = \n", "v.hcl").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Syntax, "{e}");
        assert!(!e.message.contains("HCL1"), "{e}");
    }

    #[test]
    fn the_docs_one_line_hcl1_topologies_are_explained() {
        let src = "id = \"v\"\ntype = \"csi\"\ntopology_request {\n  required {\n    topology { segments { \"rack\" = \"R2\" } }\n  }\n}\n";
        let e = parse(src, "v.hcl").unwrap_err();
        assert_eq!((e.kind, e.position.map(|p| p.line)), (ErrorKind::Syntax, Some(5)), "{e}");
        assert!(e.message.contains("put each block on its own line"), "{e}");
    }
}
