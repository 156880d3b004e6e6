use std::collections::BTreeMap;
use std::sync::Arc;

use gotmpl::{Template, Value};

use super::*;

fn try_render_data(source: &str, data: &Value) -> Result<String, String> {
    let mut env = BTreeMap::new();
    env.insert("HOME_DIR".to_string(), "/home/task".to_string());
    env.insert("EMPTY".to_string(), String::new());
    let mut funcs = pure_funcs();
    funcs.extend(env_funcs(Arc::new(env)));
    Template::new("t").funcs(funcs).parse(source).map_err(|e| e.to_string())?.execute_to_string(data).map_err(|e| e.to_string())
}

fn try_render(source: &str) -> Result<String, String> {
    try_render_data(source, &Value::Nil)
}

fn render(source: &str) -> String {
    match try_render(source) {
        Ok(out) => out,
        Err(e) => panic!("render of {source:?} failed: {e}"),
    }
}

fn assert_renders(cases: &[(&str, &str)]) {
    for (source, expected) in cases {
        assert_eq!(render(source), *expected, "template: {source}");
    }
}

fn assert_fails(source: &str, message_part: &str) {
    match try_render(source) {
        Ok(out) => panic!("{source:?} rendered {out:?}, expected an error"),
        Err(e) => assert!(e.contains(message_part), "{source:?}: error {e:?} lacks {message_part:?}"),
    }
}

#[test]
fn env_family_reads_only_the_given_environment() {
    assert_renders(&[
        (r#"{{ env "HOME_DIR" }}"#, "/home/task"),
        (r#"[{{ env "NOT_SET_ANYWHERE" }}]"#, "[]"),
        (r#"{{ mustEnv "HOME_DIR" }}"#, "/home/task"),
        (r#"{{ envOrDefault "NOT_SET_ANYWHERE" "dflt" }}"#, "dflt"),
        // Present but empty is still present.
        (r#"[{{ envOrDefault "EMPTY" "dflt" }}]"#, "[]"),
    ]);
    assert_fails(r#"{{ mustEnv "EMPTY" }}"#, "required environment variable EMPTY is empty");
    assert_fails(r#"{{ mustEnv "NOT_SET_ANYWHERE" }}"#, "NOT_SET_ANYWHERE");
}

#[test]
fn parse_functions() {
    assert_renders(&[
        (r#"{{ parseBool "true" }} {{ parseBool "F" }} {{ parseBool "" }}"#, "true false false"),
        (r#"{{ add 1 (parseInt "-42") }}"#, "-41"),
        (r#"{{ parseUint "18446744073709551615" }}"#, "18446744073709551615"),
        (r#"{{ parseFloat "1.5" }} {{ parseFloat "" }}"#, "1.5 0"),
        (r#"{{ (parseJSON "{\"a\":{\"b\":[1,2.5,\"x\",null,true]}}").a.b }}"#, "[1 2.5 x <nil> true]"),
        (r#"{{ with parseJSON "[1,2]" }}{{ index . 1 }}{{ end }}"#, "2"),
        (r#"{{ len (parseJSON "") }}"#, "0"),
        (r#"{{ (parseYAML "a:\n  b: [1, two]\n  c: 1.5\n").a.b }}"#, "[1 two]"),
        (r#"{{ (parseYAML "a:\n  c: 1.5\n").a.c }}"#, "1.5"),
        (r#"{{ range $k, $v := parseYAML "z: 1\ny: 2" }}{{ $k }}{{ $v }}{{ end }}"#, "y2z1"),
    ]);
    assert_fails(r#"{{ parseBool "maybe" }}"#, r#"parseBool: strconv.ParseBool: parsing "maybe": invalid syntax"#);
    assert_fails(r#"{{ parseInt "12a" }}"#, "invalid syntax");
    assert_fails(r#"{{ parseInt "99999999999999999999" }}"#, "value out of range");
    assert_fails(r#"{{ parseUint "-1" }}"#, "parseUint");
    assert_fails(r#"{{ parseJSON "{" }}"#, "parseJSON");
    assert_fails(r#"{{ parseYAML "a: [" }}"#, "parseYAML");
    assert_fails("{{ parseInt 5 }}", "expected string");
}

#[test]
fn json_functions_match_go_encoding() {
    assert_renders(&[
        (r#"{{ toJSON (parseJSON "{\"b\":1,\"a\":\"<\"}") }}"#, r#"{"a":"\u003c","b":1}"#),
        (r#"{{ toUnescapedJSON (parseJSON "{\"b\":1,\"a\":\"<&>\"}") }}"#, r#"{"a":"<&>","b":1}"#),
        (r#"{{ toJSON (parseJSON "[1.5,1e21,0.0000001,null,\"\\n\\t\\u0001\"]") }}"#, r#"[1.5,1e+21,1e-7,null,"\n\t\u0001"]"#),
        ("{{ toJSON (split \",\" \"a,b\") }}", r#"["a","b"]"#),
        ("{{ toJSON \"x\" }}", r#""x""#),
        (r#"{{ toJSON (parseJSON "{}") }}{{ toJSON (parseJSON "[]") }}"#, "{}[]"),
    ]);
    assert_eq!(
        render(r#"{{ toJSONPretty (parseJSON "{\"b\":[1,{}],\"a\":\"&\"}") }}"#),
        "{\n  \"a\": \"\\u0026\",\n  \"b\": [\n    1,\n    {}\n  ]\n}"
    );
    assert_eq!(render(r#"{{ toUnescapedJSONPretty (parseJSON "{\"a\":\"&\"}") }}"#), "{\n  \"a\": \"&\"\n}");
}

#[test]
fn yaml_and_toml_output() {
    let doc = r#"{\"name\":\"web\",\"port\":8080,\"tags\":[\"a\",\"b\"],\"meta\":{\"k\":\"true\",\"e\":\"\"},\"list\":[{\"x\":1,\"y\":2}],\"f\":1.5,\"n\":null}"#;
    assert_eq!(
        render(&format!(r#"{{{{ toYAML (parseJSON "{doc}") }}}}"#)),
        "f: 1.5\nlist:\n- x: 1\n  \"y\": 2\nmeta:\n  e: \"\"\n  k: \"true\"\n\"n\": null\nname: web\nport: 8080\ntags:\n- a\n- b"
    );
    assert_renders(&[
        (
            r##"{{ toYAML (parseJSON "{\"s\":\"a: b\",\"t\":\"line1\\nline2\",\"u\":\"-x\",\"v\":\"#c\"}") }}"##,
            "s: 'a: b'\nt: |-\n  line1\n  line2\nu: -x\nv: '#c'",
        ),
        (r#"{{ toYAML (parseJSON "{\"a10\":1,\"a2\":2,\"b\":{}}") }}"#, "a2: 2\na10: 1\nb: {}"),
        (r#"{{ toYAML "plain" }}"#, "plain"),
        (r#"{{ toYAML (parseJSON "[[1,2],[]]") }}"#, "- - 1\n  - 2\n- []"),
    ]);
    assert_eq!(
        render(
            r#"{{ toTOML (parseJSON "{\"name\":\"web\",\"ports\":[80,443],\"db\":{\"host\":\"h\",\"opts\":{\"ssl\":true}},\"srv\":[{\"n\":1},{\"n\":2}],\"r\":2.0,\"odd key\":\"q\\\"\"}") }}"#
        ),
        "name = \"web\"\n\"odd key\" = \"q\\\"\"\nports = [80, 443]\nr = 2.0\n\n[db]\n  host = \"h\"\n  [db.opts]\n    ssl = true\n\n[[srv]]\n  n = 1\n\n[[srv]]\n  n = 2"
    );
    assert_fails(r#"{{ toTOML "scalar" }}"#, "top-level values must be maps");
}

#[test]
fn string_functions() {
    assert_renders(&[
        (r#"{{ "a,b" | split "," | join ";" }}"#, "a;b"),
        (r#"{{ len (split "," "  ") }}"#, "0"),
        (r#"{{ split "," " a,b " }}"#, "[a b]"),
        (r#"{{ split "" "ab" }}"#, "[a b]"),
        (r#"{{ $m := splitToMap "," "=" "a=1,b=2=3,bad" }}{{ $m.a }} {{ $m.b }} {{ len $m }}"#, "1 2=3 2"),
        (r#"{{ trim "-" "--x--" }}|{{ trimSpace "  y \n" }}|{{ trimPrefix "ab" "abc" }}|{{ trimSuffix "bc" "abc" }}"#, "x|y|c|a"),
        (r#"{{ replaceAll "o" "0" "foo" }}"#, "f00"),
        (r#"{{ regexReplaceAll "(\\w+)@(\\w+)" "$2 at $1" "me@host" }}"#, "host at me"),
        (r#"{{ regexReplaceAll "a(?P<x>b)" "${x}$$" "ab" }}"#, "b$"),
        (r#"{{ regexMatch "^v[0-9]+$" "v12" }} {{ regexMatch "^v[0-9]+$" "x" }}"#, "true false"),
        (r#"{{ toLower "AbC" }} {{ toUpper "AbC" }} {{ toTitle "hello wide-world of_go" }}"#, "abc ABC Hello Wide-World Of_go"),
        ("{{ indent 2 \"a\\n\\nb\\n\" }}", "  a\n\n  b\n"),
        (r#"{{ contains "ell" "hello" }} {{ contains "x" "hello" }}"#, "true false"),
    ]);
    assert_fails(r#"{{ regexMatch "(" "x" }}"#, "regexMatch");
    assert_fails(r#"{{ regexReplaceAll "[" "" "x" }}"#, "regexReplaceAll");
    assert_fails(r#"{{ indent -1 "x" }}"#, "indent value must be a positive integer");
}

#[test]
fn collection_functions() {
    let data = Value::Map(Arc::new(
        [
            (Arc::from("tags"), Value::List(vec![Value::String("a".into()), Value::String("b".into())].into())),
            (Arc::from("nums"), Value::List(vec![Value::Int(1), Value::Float(2.5)].into())),
        ]
        .into_iter()
        .collect(),
    ));
    let cases = [
        (r#"{{ .tags | contains "a" }} {{ .tags | contains "z" }}"#, "true false"),
        (r#"{{ in .tags "b" }} {{ in .nums 1 }} {{ in .nums 2.5 }} {{ in .nums 2 }}"#, "true true true false"),
        (r#"{{ containsAll (split "," "a,b") .tags }} {{ containsAll (split "," "a,c") .tags }}"#, "true false"),
        (r#"{{ containsAny (split "," "c,b") .tags }} {{ containsAny (split "," "c") .tags }}"#, "true false"),
        (r#"{{ containsNone (split "," "c,d") .tags }} {{ containsNone (split "," "a") .tags }}"#, "true false"),
        (r#"{{ containsNotAll (split "," "a,c") .tags }} {{ containsNotAll (split "," "a") .tags }}"#, "true false"),
        (r#"{{ range loop 3 }}{{ . }}{{ end }}|{{ range loop 5 8 }}{{ . }}{{ end }}|{{ range loop "2" }}{{ . }}{{ end }}"#, "012|567|01"),
    ];
    for (source, expected) in cases {
        assert_eq!(try_render_data(source, &data).as_deref(), Ok(expected), "{source}");
    }
    assert_fails("{{ loop 1 2 3 }}", "wrong number of arguments");
    assert_fails("{{ loop 1.5 }}", "bad argument type");
    assert_fails("{{ loop 0 100000000000 }}", "exceed");
}

#[test]
fn by_key_and_by_tag_group_like_consul_template() {
    let pairs = r#"[{\"Key\":\"redis/a/b\",\"Value\":\"3\"},{\"Key\":\"es/a\",\"Value\":\"1\"},{\"Key\":\"es/b\",\"Value\":\"2\"},{\"Key\":\"es\",\"Value\":\"dir\"}]"#;
    assert_eq!(
        render(&format!(
            r#"{{{{ range $top, $pairs := byKey (parseJSON "{pairs}") }}}}{{{{ $top }}}}:{{{{ range $k, $p := $pairs }}}}{{{{ $k }}}}={{{{ $p.Key }}}}/{{{{ $p.Value }}}},{{{{ end }}}};{{{{ end }}}}"#
        )),
        "es:a=a/1,b=b/2,;redis:a/b=a/b/3,;"
    );
    let services =
        r#"[{\"Name\":\"web\",\"Tags\":[\"http\",\"prod\"]},{\"Name\":\"api\",\"Tags\":[\"http\"]},{\"Name\":\"db\",\"Tags\":null}]"#;
    assert_eq!(
        render(&format!(
            r#"{{{{ range $tag, $svcs := byTag (parseJSON "{services}") }}}}{{{{ $tag }}}}={{{{ range $svcs }}}}{{{{ .Name }}}} {{{{ end }}}};{{{{ end }}}}"#
        )),
        "http=web api ;prod=web ;"
    );
    assert_fails(r#"{{ byTag "x" }}"#, "byTag: wrong argument type");
    assert_fails(r#"{{ byKey (parseJSON "[{\"Value\":\"1\"}]") }}"#, "byKey");
}

#[test]
fn math_takes_the_operand_last() {
    assert_renders(&[
        ("{{ subtract 1 5 }}", "4"),
        ("{{ add 2 3 }} {{ multiply 4 3 }} {{ divide 2 9 }} {{ modulo 4 9 }}", "5 12 4 1"),
        ("{{ add 0.5 1 }} {{ divide 2 5.0 }}", "1.5 2.5"),
        ("{{ 10 | subtract 3 }}", "7"),
        ("{{ minimum 3 5 }} {{ maximum 3 5 }} {{ minimum 2.5 3 }} {{ maximum 1 0.5 }}", "3 5 2.5 1"),
        (r#"{{ add (parseUint "2") (parseUint "3") }}"#, "5"),
    ]);
    assert_fails("{{ divide 0 5 }}", "division by zero");
    assert_fails("{{ divide 0.0 5.0 }}", "division by zero");
    assert_fails("{{ modulo 0 5 }}", "division by zero");
    assert_fails("{{ modulo 2 5.5 }}", "modulo: unknown type");
    assert_fails(r#"{{ add 1 "x" }}"#, "add: unknown type");
    // Overflow wraps like Go's int64 instead of panicking.
    assert_eq!(render("{{ add 1 9223372036854775807 }}"), "-9223372036854775808");
    assert_eq!(render("{{ divide -1 (subtract 1 -9223372036854775807) }}"), "-9223372036854775808");
}

#[test]
fn encoding_and_hash_functions() {
    assert_renders(&[
        (r#"{{ base64Encode "hello?>" }}"#, "aGVsbG8/Pg=="),
        (r#"{{ base64URLEncode "hello?>" }}"#, "aGVsbG8_Pg=="),
        (r#"{{ base64Decode "aGVsbG8/Pg==" }}"#, "hello?>"),
        (r#"{{ base64URLDecode "aGVsbG8_Pg==" }}"#, "hello?>"),
        (r#"{{ sha256Hex "abc" }}"#, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        (r#"{{ md5sum "abc" }}"#, "900150983cd24fb0d6963f7d28e17f72"),
    ]);
    assert_fails(r#"{{ base64Decode "!!!" }}"#, "base64Decode");
    assert_fails(r#"{{ base64URLDecode "aGVsbG8/Pg==" }}"#, "base64URLDecode");
    assert_fails(r#"{{ base64Decode "/w==" }}"#, "not valid UTF-8");
}

#[test]
fn timestamp_formats() {
    let date = time::Date::from_calendar_date(2009, time::Month::November, 10);
    let t = date.and_then(|d| d.with_hms_nano(23, 4, 5, 123_400_000)).map(|dt| dt.assume_utc());
    let Ok(t) = t else { panic!("bad fixture date") };
    assert_eq!(format_go_time(t, RFC3339), "2009-11-10T23:04:05Z");
    assert_eq!(format_go_time(t, "2006-01-02 15:04:05"), "2009-11-10 23:04:05");
    assert_eq!(
        format_go_time(t, "Mon Jan _2 3:4:5 PM MST 06 002 -07:00 .000 .999 ,999999"),
        "Tue Nov 10 11:4:5 PM UTC 09 314 +00:00 .123 .123 ,1234"
    );
    assert_eq!(format_go_time(t, "Monday January 2 1 -0700"), "Tuesday November 10 11 +0000");
    let out = render("{{ timestamp }}");
    assert!(time::OffsetDateTime::parse(&out, &time::format_description::well_known::Rfc3339).is_ok(), "{out}");
    let unix: i64 = render(r#"{{ timestamp "unix" }}"#).parse().unwrap_or(0);
    assert!(unix > 1_600_000_000);
    assert_eq!(render(r#"{{ timestamp "2006" }}"#).len(), 4);
    assert_fails(r#"{{ timestamp "a" "b" }}"#, "wrong number of arguments");
}

#[test]
fn denied_functions_parse_and_then_fail() {
    assert_fails(r#"{{ plugin "echo" "x" }}"#, "function is disabled");
    assert_fails(r#"{{ "x" | writeToFile "/tmp/f" "" "" "0644" }}"#, "function is disabled");
    let mut funcs = pure_funcs();
    deny(&mut funcs, &["toUpper".to_string()]);
    let out = Template::new("t")
        .funcs(funcs)
        .parse(r#"{{ toUpper "x" }}"#)
        .map_err(|e| e.to_string())
        .and_then(|t| t.execute_to_string(&Value::Nil).map_err(|e| e.to_string()));
    assert!(out.is_err_and(|e| e.contains("function is disabled")));
}
