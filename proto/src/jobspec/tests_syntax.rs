//! Job files as people write them: HCL1 leftovers, interpolated labels, template data, and the
//! parser bugs real job files found (each a minimal reproduction).

use super::*;
use crate::job::Template;

fn parse_named(src: &str) -> Result<Job, JobspecError> {
    parse(src, &ParseOptions { filename: "job.hcl".into(), ..ParseOptions::default() })
}

fn error_of(src: &str) -> JobspecError {
    match parse_named(src) {
        Ok(job) => panic!("expected an error, got {job:?}"),
        Err(e) => e,
    }
}

/// A one-group job around a task body.
fn job_with_task(task_body: &str) -> String {
    format!("job \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"raw_exec\"\n{task_body}\n    }}\n  }}\n}}\n")
}

/// The only template of a job whose task body is `task_body`.
fn template_of(task_body: &str) -> Template {
    let job = parse_named(&job_with_task(task_body)).unwrap_or_else(|e| panic!("{e}"));
    job.task_groups[0].tasks[0].templates[0].clone()
}

// HCL1 files.

/// Each form only HCL1 reads, on the line it is on: the message keeps the parser's own error,
/// says the file looks like HCL1, that only HCL2 is read, and where the upgrade is explained.
#[test]
fn hcl1_only_forms_are_reported_as_hcl1_with_the_syntax_error() {
    let cases = [
        // Quoted attribute names in a block body (Nomad 0.12 accepted `"team" = "..."` in meta).
        ("job \"j\" {\n  meta {\n    \"team\" = \"a\"\n  }\n}\n", 3, "a quoted attribute name"),
        // Attribute names with dots.
        ("job \"j\" {\n  meta {\n    my.key = \"a\"\n  }\n}\n", 3, "an attribute name with a dot"),
        // Decimals without a leading zero.
        (
            "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      config {\n        x = .5\n      }\n    }\n  }\n}\n",
            5,
            "a decimal without a leading zero",
        ),
        // A quoted name right after a `{` on the same line.
        (
            "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      env { \"A_B\" = \"1\"\n      }\n    }\n  }\n}\n",
            4,
            "a quoted attribute name",
        ),
        // Commas between attributes.
        ("job \"j\" {\n  datacenters = [\"dc1\"],\n}\n", 2, "a comma after an attribute"),
        // Several attributes, or a nested block, on the line of a block's `{`.
        (
            "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      resources { cpu = 20 memory = 100 }\n    }\n  }\n}\n",
            4,
            "several attributes or blocks on the line of a block's {",
        ),
        (
            "job \"j\" {\n  group \"g\" {\n    constraint { attribute = \"${node.class}\" value = \"gpu\" }\n  }\n}\n",
            3,
            "several attributes or blocks on the line of a block's {",
        ),
        (
            "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      resources { network { port \"db\" {} } }\n    }\n  }\n}\n",
            4,
            "several attributes or blocks on the line of a block's {",
        ),
        ("job \"j\" { datacenters = [\"dc1\"]\n  type = \"batch\"\n}\n", 1, "several attributes or blocks on the line of a block's {"),
        // Block syntax inside an assigned value (docker `mounts` in Nomad 0.12).
        (
            "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      config {\n        mounts = [\n          {\n            type = \"tmpfs\"\n            tmpfs_options {\n              size = 1\n            }\n          }\n        ]\n      }\n    }\n  }\n}\n",
            8,
            "a block inside an assigned value",
        ),
    ];
    for (src, line, form) in cases {
        let e = error_of(src);
        assert_eq!(e.kind, ErrorKind::Syntax, "{e}");
        assert_eq!(e.position.map(|p| p.line), Some(line), "{e}");
        assert!(e.message.starts_with("syntax error: "), "the parser's error is kept: {e}");
        assert!(e.message.contains(&format!("this looks like an HCL1 job file ({form}")), "{e}");
        assert!(e.message.contains("nomad-rs reads only HCL2 job files, as Nomad 1.6 does by default"), "{e}");
        assert!(e.message.contains("-hcl1"), "{e}");
        assert!(e.message.contains(hints::HCL2_UPGRADE_GUIDE), "{e}");
    }
}

/// `config = { ... }` is a block in HCL1 and an attribute in HCL2: the decoder's message says both.
#[test]
fn a_block_written_as_an_hcl1_assignment_is_reported_as_hcl1() {
    let e = error_of(&job_with_task("      config = {\n        command = \"/bin/true\"\n      }"));
    assert_eq!(e.kind, ErrorKind::Structure);
    assert!(e.message.starts_with("\"config\" in task \"t\" is a block, not an attribute; write config { ... }"), "{e}");
    assert!(e.message.contains("(HCL1 read name = { ... } as the block; HCL2 does not, and nomad-rs reads only HCL2 job files"), "{e}");
    // An attribute that is not an object is just misplaced, not HCL1.
    let e = error_of(&job_with_task("      config = \"x\""));
    assert!(!e.message.contains("HCL1"), "{e}");
}

/// Syntax errors that are not HCL1 forms get no HCL1 advice.
#[test]
fn other_syntax_errors_are_not_called_hcl1() {
    for src in [
        "job \"j\" {\n  group \"g\" {\n    count = \n  }\n}\n",
        "job \"j\" {\n  group \"g\" {\n    count = 1\n    count = 2\n  }\n}\n",
        "job \"j\" {\n  meta = { \"a.b\" = \"c\" \n",
        "job \"j\" {\n  meta {\n    x = 1 2\n  }\n}\n",
        // An incomplete attribute in a one-line block, and a one-line block left open.
        "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      resources { cpu = }\n    }\n  }\n}\n",
        "job \"j\" {\n  group \"g\" { count = }\n}\n",
        // A comma after something that is not an attribute.
        "job \"j\" {\n  group \"g\" {},\n}\n",
    ] {
        let e = error_of(src);
        assert_eq!(e.kind, ErrorKind::Syntax, "{e}");
        assert!(!e.message.contains("HCL1"), "{src:?}: {e}");
    }
    // HCL2 does allow quoted keys and dotted names inside an object value.
    let job = parse_named(&job_with_task("      env = {\n        \"a.b\" = \"c\"\n      }")).unwrap();
    assert_eq!(job.task_groups[0].tasks[0].env["a.b"], "c");
}

/// `${NAME:-default}` in a heredoc is a shell's expansion, a syntax error in HCL2 (HCL1 left it
/// alone): the message says how to write it.
#[test]
fn a_shell_expansion_in_a_string_is_explained() {
    let e = error_of(&job_with_task(
        "      template {\n        destination = \"local/run.sh\"\n        data = <<EOH\nSLEEP=${SLEEP_SECS:-300}\nEOH\n      }",
    ));
    assert_eq!(e.kind, ErrorKind::Syntax);
    assert!(e.message.starts_with("syntax error: "), "{e}");
    assert!(e.message.contains("a shell's ${SLEEP_SECS...} must be written $${SLEEP_SECS...}"), "{e}");
    // Escaped, it is the shell's text.
    let t = template_of(
        "      template {\n        destination = \"local/run.sh\"\n        data = <<EOH\nSLEEP=$${SLEEP_SECS:-300}\nEOH\n      }",
    );
    assert_eq!(t.embedded_tmpl, "SLEEP=${SLEEP_SECS:-300}\n");
}

// Interpolated block labels.

#[test]
fn a_label_with_an_interpolation_is_explained_at_every_block_level() {
    let cases = [
        ("job \"${var.name}\" {\n}\n", 1, 5, "job", "set the id and name attributes inside the block"),
        ("job \"j\" {\n  group \"g-${var.x}\" {\n  }\n}\n", 2, 9, "group", "dynamic \"group\""),
        ("job \"j\" {\n  group \"g\" {\n    task \"${var.t}\" {\n    }\n  }\n}\n", 3, 10, "task", "dynamic \"task\""),
        ("job \"j\" {\n  group \"g\" {\n    network {\n      port \"${var.p}\" {}\n    }\n  }\n}\n", 4, 12, "port", "dynamic \"port\""),
        ("variable \"${x}\" {\n}\njob \"j\" {\n}\n", 1, 10, "variable", "write the name out"),
        // A second label, and a directive instead of an interpolation.
        (
            "job \"j\" {\n  group \"g\" {\n    task \"t\" {\n      scaling \"cpu\" \"%{if true}x%{endif}\" {}\n    }\n  }\n}\n",
            4,
            21,
            "scaling",
            "dynamic \"scaling\"",
        ),
    ];
    for (src, line, column, block, advice) in cases {
        let e = error_of(src);
        assert_eq!(e.position, Some(Position { line, column }), "{src:?}: {e}");
        assert!(e.message.starts_with(&format!("the label of this \"{block}\" block uses ")), "{src:?}: {e}");
        assert!(e.message.contains("block labels are literal strings and cannot be interpolated"), "{e}");
        assert!(e.message.contains(advice), "{e}");
        assert!(e.message.ends_with("(syntax error: expected `{`)"), "the parser's error is kept: {e}");
    }
}

#[test]
fn an_escaped_template_sequence_in_a_label_is_literal() {
    let job =
        parse_named("job \"a$${b}%%{c}\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n").unwrap();
    assert_eq!(job.id, "a${b}%{c}");
}

// Template data.

#[test]
fn custom_template_delimiters_parse_and_are_kept() {
    let t = template_of(
        "      template {\n        left_delimiter  = \"[[\"\n        right_delimiter = \"]]\"\n        destination     = \"local/a.conf\"\n        data            = <<EOH\naddr=[[ env \"NOMAD_ADDR_http\" ]]\nliteral={{ not an action }}\nEOH\n      }",
    );
    assert_eq!((t.left_delim.as_str(), t.right_delim.as_str()), ("[[", "]]"));
    assert_eq!(t.embedded_tmpl, "addr=[[ env \"NOMAD_ADDR_http\" ]]\nliteral={{ not an action }}\n");
    let json = serde_json::to_value(&t).unwrap();
    assert_eq!((json["LeftDelim"].as_str(), json["RightDelim"].as_str()), (Some("[["), Some("]]")), "Nomad's JSON names");
    // Unset, they are Go template's, as Nomad fills them.
    let t = template_of("      template {\n        destination = \"local/b\"\n        data = \"x\"\n      }");
    assert_eq!((t.left_delim.as_str(), t.right_delim.as_str()), ("{{", "}}"));
}

/// What consul-template gets is what Nomad hands it: HCL2 unescapes `$${` and `%%{`, keeps
/// runtime `${...}` references as written (spaces inside the braces too), and leaves Go
/// template actions, `%` and `$` that start no sequence alone.
#[test]
fn template_data_reaches_the_template_byte_for_byte() {
    let t = template_of(concat!(
        "      template {\n        destination = \"local/run.sh\"\n        data = <<EOH\n",
        "{{ range service \"db\" }}{{ .Address }}:{{ .Port }}{{ end }}\n",
        "{{ with secret \"kv/data/x\" }}{{ .Data.data.pw }}{{ end }}\n",
        "dir=${NOMAD_ALLOC_DIR}/data spaced=${ NOMAD_TASK_DIR } ip=${attr.unique.network.ip-address}\n",
        "meta=${meta.rack} env=${env[\"HOME\"]}\n",
        "escaped=$${HOME} directive=%%{ if } shell=$HOME price=100% fmt=%s%d {not a sequence} $ {x}\n",
        "EOH\n      }",
    ));
    assert_eq!(
        t.embedded_tmpl,
        concat!(
            "{{ range service \"db\" }}{{ .Address }}:{{ .Port }}{{ end }}\n",
            "{{ with secret \"kv/data/x\" }}{{ .Data.data.pw }}{{ end }}\n",
            "dir=${NOMAD_ALLOC_DIR}/data spaced=${ NOMAD_TASK_DIR } ip=${attr.unique.network.ip-address}\n",
            "meta=${meta.rack} env=${env[\"HOME\"]}\n",
            "escaped=${HOME} directive=%{ if } shell=$HOME price=100% fmt=%s%d {not a sequence} $ {x}\n",
        )
    );
}

#[test]
fn indented_heredocs_lose_their_common_indentation_only() {
    let t = template_of(concat!(
        "      template {\n        destination = \"local/x\"\n        data = <<-EOT\n",
        "          line one\n",
        "            indented {{ .Two }}\n",
        "\n",
        "          ${NOMAD_JOB_NAME}\n",
        "          EOT\n      }",
    ));
    assert_eq!(t.embedded_tmpl, "line one\n  indented {{ .Two }}\n\n${NOMAD_JOB_NAME}\n");
    // A plain heredoc keeps its indentation; the closing marker may be indented.
    let t = template_of("      template {\n        destination = \"local/y\"\n        data = <<EOH\n  a\n    b\n  EOH\n      }");
    assert_eq!(t.embedded_tmpl, "  a\n    b\n");
}

/// A quoted data string: escapes are HCL's, actions stay.
#[test]
fn quoted_template_data_unescapes_hcl_escapes_only() {
    let t = template_of(
        "      template {\n        destination = \"local/z\"\n        data = \"{{ key \\\"a/b\\\" }}\\n$${X} ${NOMAD_PORT_http}\"\n      }",
    );
    assert_eq!(t.embedded_tmpl, "{{ key \"a/b\" }}\n${X} ${NOMAD_PORT_http}");
}

/// Runtime references stay as written, whatever their shape (Nomad's own list of cases): the
/// client interpolates them, so a changed character is a changed job.
#[test]
fn runtime_references_are_kept_as_written() {
    for value in [
        "plain",
        "foo-${BAR}",
        "foo-${attr.network.dev-us-east1-relay-vpc.external-ip.0}",
        "${env[\"BLAH\"]}",
        "${mixed-indexing.0[3][\"FOO\"].5}",
        "with spaces ${   root.  field[  \"FOO\"].5  }",
    ] {
        // Quotes inside `${...}` belong to the expression, so the value is written as is.
        let src = format!("job \"example\" {{\n  region = \"{value}\"\n}}\n");
        let job = parse_named(&src).unwrap_or_else(|e| panic!("{value}: {e}"));
        assert_eq!(job.region, value);
    }
    let job = parse_named("job \"example\" {\n  region = meta.mytest\n}\n").unwrap();
    assert_eq!(job.region, "${meta.mytest}", "an unquoted reference becomes its interpolation");
}

// Parser gaps found by real job files.

/// `reserved_ports "<label>" { static = N }` is in Nomad 1.6's network schema: a static port.
/// Beside `port` blocks Nomad drops it without a word, so that is refused.
#[test]
fn reserved_ports_blocks_are_static_ports() {
    let job = parse_named(
        "job \"j\" {\n  group \"g\" {\n    network {\n      reserved_ports \"http\" {\n        static = 8080\n        to     = 80\n      }\n    }\n    task \"t\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let n = &job.task_groups[0].networks[0];
    assert_eq!(n.reserved_ports.iter().map(|p| (p.label.as_str(), p.value, p.to)).collect::<Vec<_>>(), [("http", 8080, 80)]);
    assert!(n.dynamic_ports.is_empty());

    let e = error_of(
        "job \"j\" {\n  group \"g\" {\n    network {\n      port \"a\" {}\n      reserved_ports \"b\" {\n        static = 81\n      }\n    }\n  }\n}\n",
    );
    assert_eq!(e.position.map(|p| p.line), Some(5), "{e}");
    assert!(e.message.contains("reserved_ports \"b\" in network block of group \"g\" cannot be combined with port blocks"), "{e}");

    let e = error_of("job \"j\" {\n  group \"g\" {\n    network {\n      reserved_ports \"b\" {}\n    }\n  }\n}\n");
    assert!(e.message.contains("needs static"), "{e}");
    let e = error_of(
        "job \"j\" {\n  group \"g\" {\n    network {\n      reserved_ports \"b\" {\n        static = 1\n      }\n      reserved_ports \"b\" {\n        static = 2\n      }\n    }\n  }\n}\n",
    );
    assert!(e.message.contains("port \"b\" is defined twice"), "{e}");
}

/// `<<-` dedents as HCL2 does: lines of only whitespace neither count nor lose theirs, lines
/// inside directive bodies are dedented too, and CRLF line endings stay.
#[test]
fn indented_heredocs_dedent_as_hcl2_does() {
    let data = |body: &str| {
        template_of(&format!("      template {{\n        destination = \"local/x\"\n        data = <<-EOT\n{body}        EOT\n      }}"))
            .embedded_tmpl
    };
    // A line of two spaces among lines of four: the four go, the two stay.
    assert_eq!(data("    a\n  \n    b\n"), "a\n  \nb\n");
    // Directive bodies are lines like the others.
    assert_eq!(data("    %{ if true }\n    a\n    %{ endif }\n    b\n"), "\na\n\nb\n");
    assert_eq!(data("    %{ for x in [1, 2] }\n      ${x}\n    %{ endfor }\n"), "\n  1\n\n  2\n\n");
    // A line that starts with an interpolation has no indentation to lose, so none is lost.
    assert_eq!(data("    a\n${NOMAD_TASK_DIR}\n"), "    a\n${NOMAD_TASK_DIR}\n");
    // Escapes are unescaped after dedenting.
    assert_eq!(data("    $${X}\n      %%{ y }\n"), "${X}\n  %{ y }\n");
    // CRLF: the line endings are kept.
    let src = job_with_task("      template {\n        destination = \"local/x\"\n        data = <<-EOT\n    a\n      b\n    EOT\n      }");
    let job = parse_named(&src.replace('\n', "\r\n")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(job.task_groups[0].tasks[0].templates[0].embedded_tmpl, "a\r\n  b\r\n");
}
