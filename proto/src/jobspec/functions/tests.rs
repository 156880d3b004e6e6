//! One test per function with the examples of Nomad 1.6's function docs
//! (`website/content/docs/job-specification/hcl2/functions/*/*.mdx`) and a
//! bad call with its message. Where Nomad 1.6.1's code disagrees with its own
//! docs (docs copied from Terraform), the test follows the code and says so.

use std::path::Path;

use hcl::Value;

use super::{FileAccess, NOMAD_FUNCTIONS};
use crate::jobspec::eval::{Evaluator, Scope};

/// Evaluates an HCL expression with functions, as a job file would (files from `dir`, if given).
fn eval_in(src: &str, dir: Option<&Path>) -> Result<Value, String> {
    let expr = hcl::edit::parser::parse_expr(src).map_err(|e| format!("syntax: {}", e.message()))?;
    let files = FileAccess { allowed: dir.is_some(), base_dir: dir.map(Path::to_path_buf) };
    Evaluator::for_job_file(src).with_file_access(files).eval(&expr, &Scope::default()).map_err(|d| d.message)
}

fn eval(src: &str) -> Result<Value, String> {
    eval_in(src, None)
}

/// `src` evaluates to the value the HCL text `want` writes.
#[track_caller]
fn check(src: &str, want: &str) {
    let want_value = eval(want).unwrap_or_else(|e| panic!("expected value {want}: {e}"));
    match eval(src) {
        Ok(got) => assert_eq!(got, want_value, "{src}"),
        Err(e) => panic!("{src} failed: {e}"),
    }
}

/// `src` evaluates to the string `want`.
#[track_caller]
fn check_str(src: &str, want: &str) {
    assert_eq!(eval(src), Ok(Value::String(want.to_string())), "{src}");
}

/// `src` fails with a message containing `part`.
#[track_caller]
fn fails(src: &str, part: &str) {
    match eval(src) {
        Ok(v) => panic!("{src} succeeded with {v:?}, expected an error containing {part:?}"),
        Err(e) => assert!(e.contains(part), "{src}: {e:?} does not contain {part:?}"),
    }
}

#[test]
fn the_function_names_are_exactly_nomad_1_6_1s() {
    // A literal copy of the keys of jobspec2/functions.go's Functions() at v1.6.1.
    let nomad: &[&str] = &[
        "abs",
        "base64decode",
        "base64encode",
        "bcrypt",
        "can",
        "ceil",
        "chomp",
        "chunklist",
        "cidrhost",
        "cidrnetmask",
        "cidrsubnet",
        "cidrsubnets",
        "coalesce",
        "coalescelist",
        "compact",
        "concat",
        "contains",
        "convert",
        "csvdecode",
        "distinct",
        "element",
        "flatten",
        "floor",
        "format",
        "formatdate",
        "formatlist",
        "indent",
        "index",
        "join",
        "jsondecode",
        "jsonencode",
        "keys",
        "length",
        "log",
        "lookup",
        "lower",
        "max",
        "md5",
        "merge",
        "min",
        "parseint",
        "pow",
        "range",
        "reverse",
        "replace",
        "regex_replace",
        "rsadecrypt",
        "setintersection",
        "setproduct",
        "setunion",
        "sha1",
        "sha256",
        "sha512",
        "signum",
        "slice",
        "sort",
        "split",
        "strlen",
        "strrev",
        "substr",
        "timeadd",
        "title",
        "trim",
        "trimprefix",
        "trimspace",
        "trimsuffix",
        "try",
        "upper",
        "urlencode",
        "uuidv4",
        "uuidv5",
        "values",
        "yamldecode",
        "yamlencode",
        "zipmap",
        "abspath",
        "basename",
        "dirname",
        "file",
        "filebase64",
        "fileexists",
        "fileset",
        "pathexpand",
    ];
    let mut nomad: Vec<&str> = nomad.to_vec();
    nomad.sort();
    assert_eq!(NOMAD_FUNCTIONS, nomad.as_slice());
    // Every listed name is implemented: a call reaches the function (wrong arguments, not "unknown").
    let files = FileAccess { allowed: true, base_dir: None };
    for name in NOMAD_FUNCTIONS {
        if matches!(*name, "can" | "try" | "convert") {
            continue;
        }
        let args = vec![Value::Array(vec![Value::Array(Vec::new())]); 7];
        if let Err(e) = super::call(name, args, &files) {
            assert!(!e.contains("unknown function"), "{name}: {e}");
        }
    }
}

#[test]
fn names_nomad_1_6_does_not_have_are_unknown_functions() {
    // Terraform and later Nomad versions have these; Nomad 1.6.1's list does not.
    for name in [
        "startswith",
        "endswith",
        "strcontains",
        "tostring",
        "tonumber",
        "tobool",
        "tolist",
        "toset",
        "tomap",
        "setsubtract",
        "transpose",
        "regex",
        "regexall",
        "templatefile",
        "timestamp",
        "base64gzip",
        "textencodebase64",
        "sum",
        "one",
        "alltrue",
    ] {
        fails(&format!("{name}(\"x\")"), &format!("{name}(): call to unknown function"));
    }
    fails("uper(\"x\")", "call to unknown function; did you mean \"upper\"?");
}

// ---- strings

#[test]
fn chomp() {
    check_str(r#"chomp("hello\n")"#, "hello");
    check_str(r#"chomp("hello\r\n")"#, "hello");
    check_str(r#"chomp("hello\n\n")"#, "hello");
    fails("chomp([])", "a string is required, got list");
}

#[test]
fn format() {
    check_str(r#"format("Hello, %s!", "Ander")"#, "Hello, Ander!");
    check_str(r#"format("There are %d lights", 4)"#, "There are 4 lights");
    check_str(r#"format("%s-%03d", "web", 7)"#, "web-007");
    check_str(
        r#"format("%-5s|%5s|%.2f|%x|%X|%o|%b|%e|%t|%q", "a", "b", 3.14159, 255, 255, 8, 5, 1234.5678, true, "q")"#,
        "a    |    b|3.14|ff|FF|10|101|1.234568e+03|true|\"q\"",
    );
    check_str(r#"format("%v %v %v %#v", "s", 1.5, [1, "a"], "s")"#, "s 1.5 [1,\"a\"] \"s\"");
    check_str(r#"format("%[2]s %[1]s %s", "a", "b")"#, "b a b");
    check_str(r#"format("%+d % d %%", 5, 5)"#, "+5  5 %");
    check_str(r#"format("%v", 1000000)"#, "1e+06");
    fails(r#"format("%d", 1.5)"#, "an integer is required");
    fails(r#"format("%s %s", "a")"#, "not enough arguments");
    fails(r#"format("%s", "a", "b")"#, "too many arguments; only 1 used by format string");
    fails(r#"format("x", "a")"#, "too many arguments; no verbs in format string");
    fails(r#"format("%y", 1)"#, "unsupported format verb");
    fails(r#"format("%s", null)"#, "null value cannot be formatted");
}

#[test]
fn formatlist() {
    check(
        r#"formatlist("Hello, %s!", ["Valentina", "Ander", "Olivia", "Sam"])"#,
        r#"["Hello, Valentina!", "Hello, Ander!", "Hello, Olivia!", "Hello, Sam!"]"#,
    );
    check(
        r#"formatlist("%s, %s!", "Salutations", ["Valentina", "Ander", "Olivia", "Sam"])"#,
        r#"["Salutations, Valentina!", "Salutations, Ander!", "Salutations, Olivia!", "Salutations, Sam!"]"#,
    );
    fails(r#"formatlist("%s%s", ["a"], ["b", "c"])"#, "argument 2 has length 2, which is inconsistent with argument 1 of length 1");
}

#[test]
fn indent() {
    check_str(r#""  items: ${indent(2, "[\n  foo,\n  bar,\n]\n")}""#, "  items: [\n    foo,\n    bar,\n  ]\n  ");
    fails(r#"indent(-1, "x")"#, "must not be negative");
}

#[test]
fn join() {
    check_str(r#"join(", ", ["foo", "bar", "baz"])"#, "foo, bar, baz");
    check_str(r#"join(", ", ["foo"])"#, "foo");
    check_str(r#"join("-", ["a"], ["b", "c"])"#, "a-b-c");
    fails(r#"join(",")"#, "not enough function arguments");
    fails(r#"join(",", ["a", null])"#, "is null; cannot concatenate null values");
}

#[test]
fn lower_and_upper() {
    check_str(r#"lower("HELLO")"#, "hello");
    check_str(r#"lower("АЛЛО!")"#, "алло!");
    check_str(r#"upper("hello")"#, "HELLO");
    check_str(r#"upper("алло!")"#, "АЛЛО!");
    fails(r#"upper("a", "b")"#, "too many function arguments");
}

#[test]
fn regex_replace() {
    check_str(r#"regex_replace("hello world", "world", "everybody")"#, "hello everybody");
    check_str(r#"regex_replace("hello world", "w.*d", "everybody")"#, "hello everybody");
    check_str(r#"regex_replace("-ab-axxb-", "a(x*)b", "$1W")"#, "---");
    check_str(r#"regex_replace("-ab-axxb-", "a(x*)b", "$${1}W")"#, "-W-xxW-");
    fails(r#"regex_replace("x", "a(", "b")"#, "error parsing regexp");
}

#[test]
fn replace() {
    check_str(r#"replace("1 + 2 + 3", "+", "-")"#, "1 - 2 - 3");
    check_str(r#"replace("hello world", "world", "everybody")"#, "hello everybody");
    // No regular expressions in cty's replace: slashes are literal.
    check_str(r#"replace("a/b/", "/b/", "c")"#, "ac");
    check_str(r#"replace("ab", "", "-")"#, "-a-b-");
    fails(r#"replace("a", "b")"#, "not enough function arguments");
}

#[test]
fn split() {
    check(r#"split(",", "foo,bar,baz")"#, r#"["foo", "bar", "baz"]"#);
    check(r#"split(",", "foo")"#, r#"["foo"]"#);
    check(r#"split(",", "")"#, r#"[""]"#);
    fails(r#"split(",")"#, "not enough function arguments");
}

#[test]
fn strlen() {
    check("strlen(\"hello\")", "5");
    check("strlen(\"👾🕹️\")", "2");
    fails("strlen([])", "a string is required");
}

#[test]
fn strrev() {
    check_str(r#"strrev("hello")"#, "olleh");
    check_str(r#"strrev("a ☃")"#, "☃ a");
    fails("strrev({})", "a string is required, got object");
}

#[test]
fn substr() {
    check_str(r#"substr("hello world", 1, 4)"#, "ello");
    check_str(r#"substr("🤔🤷", 0, 1)"#, "🤔");
    check_str(r#"substr("hello", -3, -1)"#, "llo");
    check_str(r#"substr("hello", 10, 1)"#, "");
    fails(r#"substr("hello", 1.5, 1)"#, "a whole number is required");
}

#[test]
fn title() {
    check_str(r#"title("hello world")"#, "Hello World");
    check_str(r#"title("snake_case-and.dots")"#, "Snake_case-And.Dots");
    fails("title()", "not enough function arguments");
}

#[test]
fn trims() {
    check_str(r#"trim("?!hello?!", "!?")"#, "hello");
    check_str(r#"trimprefix("helloworld", "hello")"#, "world");
    check_str(r#"trimspace("  hello\n\n")"#, "hello");
    check_str(r#"trimsuffix("helloworld", "world")"#, "hello");
    fails(r#"trim("x")"#, "not enough function arguments");
    fails(r#"trimprefix("x")"#, "not enough function arguments");
    fails(r#"trimsuffix([], "x")"#, "a string is required");
    fails(r#"trimspace([])"#, "a string is required");
}

// ---- collections

#[test]
fn chunklist() {
    check(r#"chunklist(["a", "b", "c", "d", "e"], 2)"#, r#"[["a", "b"], ["c", "d"], ["e"]]"#);
    check(r#"chunklist(["a", "b", "c", "d", "e"], 1)"#, r#"[["a"], ["b"], ["c"], ["d"], ["e"]]"#);
    check(r#"chunklist(["a"], 0)"#, r#"[["a"]]"#);
    fails(r#"chunklist(["a"], -1)"#, "the size argument must be positive");
}

#[test]
fn coalesce() {
    check_str(r#"coalesce("a", "b")"#, "a");
    check(r#"coalesce(1, 2)"#, "1");
    check_str(r#"coalesce(null, "b")"#, "b");
    // The docs say "b", but Nomad 1.6.1's cty coalesce skips only nulls, not empty strings.
    check_str(r#"coalesce("", "b")"#, "");
    check_str(r#"coalesce(["", "b"]...)"#, "");
    // Mixed types meet in a string.
    check_str(r#"coalesce(null, 1, "b")"#, "1");
    fails("coalesce(null)", "no non-null arguments");
}

#[test]
fn coalescelist() {
    check(r#"coalescelist(["a", "b"], ["c", "d"])"#, r#"["a", "b"]"#);
    check(r#"coalescelist([], ["c", "d"])"#, r#"["c", "d"]"#);
    check(r#"coalescelist([[], ["c", "d"]]...)"#, r#"["c", "d"]"#);
    fails(r#"coalescelist("a")"#, "coalescelist arguments must be lists or tuples");
}

#[test]
fn compact() {
    check(r#"compact(["a", "", "b", "c"])"#, r#"["a", "b", "c"]"#);
    check(r#"compact(["a", null, ""])"#, r#"["a"]"#);
    fails(r#"compact("a")"#, "a list is required");
}

#[test]
fn concat() {
    check(r#"concat(["a", ""], ["b", "c"])"#, r#"["a", "", "b", "c"]"#);
    fails(r#"concat(["a"], "b")"#, "all arguments must be lists or tuples");
    fails("concat()", "not enough function arguments");
}

#[test]
fn contains() {
    check(r#"contains(["a", "b", "c"], "a")"#, "true");
    check(r#"contains(["a", "b", "c"], "d")"#, "false");
    fails(r#"contains("abc", "a")"#, "argument must be list, tuple, or set");
}

#[test]
fn distinct() {
    check(r#"distinct(["a", "b", "a", "c", "d", "b"])"#, r#"["a", "b", "c", "d"]"#);
    fails(r#"distinct({})"#, "a list is required");
}

#[test]
fn element() {
    check_str(r#"element(["a", "b", "c"], 1)"#, "b");
    check_str(r#"element(["a", "b", "c"], 3)"#, "a");
    fails(r#"element([], 0)"#, "cannot use element function with an empty list");
    fails(r#"element(["a"], -1)"#, "cannot use element function with a negative index");
}

#[test]
fn flatten() {
    check(r#"flatten([["a", "b"], [], ["c"]])"#, r#"["a", "b", "c"]"#);
    check(r#"flatten([[["a", "b"], []], ["c"]])"#, r#"["a", "b", "c"]"#);
    check(r#"flatten([{a = [1]}, [2]])"#, r#"[{a = [1]}, 2]"#);
    fails(r#"flatten("a")"#, "can only flatten lists, sets and tuples");
}

#[test]
fn index() {
    check_str(r#"index(["a", "b", "c"], 1)"#, "b");
    check(r#"index({"a"=1, "c"=2, "d"=3}, "c")"#, "2");
    fails(r#"index(["a"], 3)"#, "invalid index");
    fails(r#"index("a", 0)"#, "collection must be a list, a map or a tuple");
}

#[test]
fn keys_and_values() {
    check(r#"keys({a=1, c=2, d=3})"#, r#"["a", "c", "d"]"#);
    check(r#"keys({d=1, a=2})"#, r#"["a", "d"]"#);
    check(r#"values({a=3, c=2, d=1})"#, "[3, 2, 1]");
    check(r#"values({d=1, a=2})"#, "[2, 1]");
    fails("keys([])", "must have map or object type");
    fails("values([])", "values() requires a map as the first argument");
}

#[test]
fn length() {
    check("length([])", "0");
    check(r#"length(["a", "b"])"#, "2");
    check(r#"length({"a" = "b"})"#, "1");
    // cty's length takes collections only (strlen counts a string's characters).
    fails(r#"length("hello")"#, "collection must be a list, a map or a tuple");
}

#[test]
fn lookup() {
    check_str(r#"lookup({a="ay", b="bee"}, "a", "what?")"#, "ay");
    check_str(r#"lookup({a="ay", b="bee"}, "c", "what?")"#, "what?");
    // cty's lookup (the one Nomad has) needs its default.
    fails(r#"lookup({a="ay"}, "a")"#, "not enough function arguments");
    fails(r#"lookup(["a"], "a", "b")"#, "lookup() requires a map as the first argument");
}

#[test]
fn merge() {
    check(r#"merge({"a"="b", "c"="d"}, {"e"="f", "c"="z"})"#, r#"{"a" = "b", "c" = "z", "e" = "f"}"#);
    check("merge()", "{}");
    check(r#"merge(null, {a = 1})"#, "{a = 1}");
    fails(r#"merge({}, ["a"])"#, "arguments must be maps or objects");
}

#[test]
fn range() {
    check("range(3)", "[0, 1, 2]");
    check("range(1, 4)", "[1, 2, 3]");
    check("range(1, 8, 2)", "[1, 3, 5, 7]");
    check("range(1, 4, 0.5)", "[1, 1.5, 2, 2.5, 3, 3.5]");
    check("range(4, 1)", "[4, 3, 2]");
    check("range(10, 5, -2)", "[10, 8, 6]");
    check("range(0)", "[]");
    fails("range(1025)", "more than 1024 values were generated");
    fails("range(1, 2, 0)", "step must not be zero");
    fails("range(5, 1, 1)", "end must be greater than start when step is positive");
    fails("range()", "must have one, two, or three arguments");
}

#[test]
fn reverse() {
    check("reverse([1, 2, 3])", "[3, 2, 1]");
    fails(r#"reverse("abc")"#, "can only reverse list or tuple values");
}

#[test]
fn setintersection() {
    check(r#"setintersection(["a", "b"], ["b", "c"], ["b", "d"])"#, r#"["b"]"#);
    check(r#"setintersection(["c", "b", "a"], ["a", "c"])"#, r#"["a", "c"]"#);
    fails(r#"setintersection(["a"], "a")"#, "a set or a list is required");
}

#[test]
fn setproduct() {
    check(
        r#"setproduct(["development", "staging", "production"], ["app1", "app2"])"#,
        r#"[["development", "app1"], ["development", "app2"], ["staging", "app1"], ["staging", "app2"], ["production", "app1"], ["production", "app2"]]"#,
    );
    check(
        r#"setproduct(["staging", "production"], ["a", 2])"#,
        r#"[["staging", "a"], ["staging", "2"], ["production", "a"], ["production", "2"]]"#,
    );
    check(r#"setproduct([], ["a"])"#, "[]");
    fails(r#"setproduct(["a"])"#, "at least two arguments are required");
    fails("setproduct(range(1000), range(1000))", "at most 100000 elements");
}

#[test]
fn setunion() {
    // The docs show ["d", "b", "c", "a"], an older cty's hash order; cty 1.12 (Nomad 1.6.1) sorts strings.
    check(r#"setunion(["a", "b"], ["b", "c"], ["d"])"#, r#"["a", "b", "c", "d"]"#);
    check("setunion([3, 1], [2, 1])", "[1, 2, 3]");
    fails(r#"setunion("a")"#, "a set or a list is required");
}

#[test]
fn slice() {
    check(r#"slice(["a", "b", "c", "d"], 1, 3)"#, r#"["b", "c"]"#);
    fails(r#"slice(["a"], 0, 2)"#, "end index must not be greater than the length of the list");
    fails(r#"slice(["a", "b"], 2, 1)"#, "start index must not be greater than end index");
    fails(r#"slice(["a"], -1, 1)"#, "start index must not be less than zero");
}

#[test]
fn sort() {
    check(r#"sort(["e", "d", "a", "x"])"#, r#"["a", "d", "e", "x"]"#);
    check(r#"sort([10, 9])"#, r#"["10", "9"]"#);
    fails(r#"sort([["a"]])"#, "a string is required");
}

#[test]
fn zipmap() {
    check(r#"zipmap(["a", "b"], [1, 2])"#, r#"{"a" = 1, "b" = 2}"#);
    check(r#"zipmap(["a", "a"], [1, 2])"#, r#"{"a" = 2}"#);
    fails(r#"zipmap(["a"], [1, 2])"#, "number of keys (1) does not match number of values (2)");
}

// ---- conversion

#[test]
fn can() {
    check(r#"can(local_foo.bar)"#, "true"); // an unknown root is a runtime interpolation, which succeeds
    check(r#"can({bar = "baz"}.bar)"#, "true");
    check(r#"can({bar = "baz"}.boop)"#, "false");
    check(r#"can(parseint("x", 10))"#, "false");
    fails(r#"can(1, 2)"#, "expected 1 argument, got 2");
}

#[test]
fn try_() {
    check_str(r#"try({bar = "baz"}.bar, "fallback")"#, "baz");
    check_str(r#"try({bar = "baz"}.boop, "fallback")"#, "fallback");
    check_str(r#"try(parseint("x", 10), upper("y"))"#, "Y");
    fails(r#"try({}.a, [][0])"#, "no expression succeeded");
    fails("try()", "at least one argument is required");
}

#[test]
fn try_does_not_swallow_a_spent_budget() {
    // Each doubling of a 1 MiB string costs its size; try must not turn "too expensive" into a fallback
    // that lets evaluation go on.
    let expensive = "[for i in range(1024) : [for j in range(1024) : [for k in range(1024) : k]]]";
    fails(&format!("try({expensive}, 1)"), "too expensive");
}

#[test]
fn convert() {
    check_str("convert(3, string)", "3");
    check("convert(\"3\", number)", "3");
    check("convert(\"false\", bool)", "false");
    check_str("convert(false, string)", "false");
    check(r#"convert(["a", "b", 3], list(string))"#, r#"["a", "b", "3"]"#);
    check(r#"convert(["c", "b", "b"], set(string))"#, r#"["b", "c"]"#);
    check(r#"convert({"a" = "foo", "b" = true}, map(string))"#, r#"{"a" = "foo", "b" = "true"}"#);
    fails(r#"convert("abc", number)"#, "number required");
    fails(r#"convert(1, strung)"#, "invalid type: unknown type \"strung\"");
}

// ---- numbers

#[test]
fn abs_ceil_floor_signum() {
    check("abs(23)", "23");
    check("abs(0)", "0");
    check("abs(-12.4)", "12.4");
    check("ceil(5)", "5");
    check("ceil(5.1)", "6");
    check("floor(5)", "5");
    check("floor(4.9)", "4");
    check("signum(-13)", "-1");
    check("signum(0)", "0");
    check("signum(344)", "1");
    fails(r#"abs("x")"#, "a number is required");
    fails("ceil([])", "a number is required");
    fails("floor({})", "a number is required");
    fails("signum(true)", "a number is required");
}

#[test]
fn log() {
    check("log(50, 10)", "1.6989700043360185");
    check("log(16, 2)", "4");
    check("ceil(log(15, 2))", "4");
    check("ceil(log(16, 2))", "4");
    check("ceil(log(17, 2))", "5");
    fails("log(0, 10)", "not a finite number");
}

#[test]
fn max_and_min() {
    check("max(12, 54, 3)", "54");
    check("max([12, 54, 3]...)", "54");
    check("min(12, 54, 3)", "3");
    check("min([12, 54, 3]...)", "3");
    fails("max()", "must pass at least one number");
    fails(r#"min(1, "a")"#, "a number is required");
}

#[test]
fn parseint() {
    check(r#"parseint("100", 10)"#, "100");
    check(r#"parseint("FF", 16)"#, "255");
    check(r#"parseint("-10", 16)"#, "-16");
    check(r#"parseint("1011111011101111", 2)"#, "48879");
    check(r#"parseint("aA", 62)"#, "656");
    fails(r#"parseint("12", 2)"#, "cannot parse \"12\" as a base 2 integer");
    fails(r#"parseint("1", 63)"#, "base must be a whole number between 2 and 62 inclusive");
    fails(r#"parseint(12, 10)"#, "first argument must be a string");
}

#[test]
fn pow() {
    check("pow(3, 2)", "9");
    check("pow(4, 0)", "1");
    check("pow(2, 0.5)", "1.4142135623730951");
    fails("pow(1)", "not enough function arguments");
}

// ---- encodings

#[test]
fn base64() {
    check_str(r#"base64decode("SGVsbG8gV29ybGQ=")"#, "Hello World");
    check_str(r#"base64encode("Hello World")"#, "SGVsbG8gV29ybGQ=");
    fails(r#"base64decode("SGVsbG8gV29ybGQ")"#, "failed to decode base64 data 'SGVsbG8gV29ybGQ'");
    fails(r#"base64decode("/w==")"#, "not valid UTF-8");
    fails("base64encode([])", "a string is required");
}

#[test]
fn csvdecode() {
    check(r#"csvdecode("a,b,c\n1,2,3\n4,5,6")"#, r#"[{"a" = "1", "b" = "2", "c" = "3"}, {"a" = "4", "b" = "5", "c" = "6"}]"#);
    check(r#"csvdecode("a,b\n\"x,\"\"y\"\"\",2\r\n\n")"#, r#"[{a = "x,\"y\"", b = "2"}]"#);
    check(r#"csvdecode("a,b")"#, "[]");
    fails(r#"csvdecode("a,b\n1")"#, "CSV parse error on line 2: wrong number of fields");
    fails(r#"csvdecode("")"#, "missing header line");
    fails(r#"csvdecode("a,a\n1,2")"#, "duplicate column name \"a\"");
    fails(r#"csvdecode("a\nx\"y")"#, "bare \" in non-quoted-field");
}

#[test]
fn jsondecode_and_jsonencode() {
    check(r#"jsondecode("{\"hello\": \"world\"}")"#, r#"{"hello" = "world"}"#);
    check(r#"jsondecode("true")"#, "true");
    check_str(r#"jsonencode({"hello"="world"})"#, r#"{"hello":"world"}"#);
    // Keys sorted and HTML characters escaped, as cty and Go write JSON.
    check_str(r#"jsonencode({b = [1, 2.5, null, true], a = "<&>"})"#, r#"{"a":"\u003c\u0026\u003e","b":[1,2.5,null,true]}"#);
    fails(r#"jsondecode("{")"#, "invalid JSON");
}

#[test]
fn urlencode() {
    // The docs say Hello%20World; Nomad 1.6.1's go-cty-funcs uses Go's url.QueryEscape, which writes "+".
    check_str(r#"urlencode("Hello World")"#, "Hello+World");
    check_str(r#"urlencode("☃")"#, "%E2%98%83");
    check_str(r#""http://example.com/search?q=${urlencode("nomad urlencode")}""#, "http://example.com/search?q=nomad+urlencode");
    check_str(r#"urlencode("a-b_c.d~e/f?g")"#, "a-b_c.d~e%2Ff%3Fg");
    fails("urlencode([])", "a string is required");
}

#[test]
fn yamldecode() {
    check(r#"yamldecode("{\"hello\": \"world\"}")"#, r#"{"hello" = "world"}"#);
    check(r#"yamldecode("true")"#, "true");
    check(r#"yamldecode("{a: &foo [1, 2, 3], b: *foo}")"#, r#"{"a" = [1, 2, 3], "b" = [1, 2, 3]}"#);
    check(
        r#"yamldecode("a: yes\nb: ~\nc: '1'\nd: 0x1F\ne: 1.5\nf: 2001-12-14\ng: !!str 12\nbase: &b {x: 1}\nm:\n  <<: *b\n  w: 2\n")"#,
        r#"{a = true, b = null, c = "1", d = 31, e = 1.5, f = "2001-12-14T00:00:00Z", g = "12", base = {x = 1}, m = {x = 1, w = 2}}"#,
    );
    fails(r#"yamldecode("{a: &foo [1, *foo, 3]}")"#, "cannot refer to anchor from inside its own definition");
    fails(r#"yamldecode("{a: !not-supported foo}")"#, "unsupported tag \"!not-supported\"");
    fails(r#"yamldecode("a: 1\n---\nb: 2")"#, "only a single document is allowed");
    fails(r#"yamldecode("a: [")"#, "line");
}

#[test]
fn yamldecode_bounds_alias_expansion() {
    let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let prev = i - 1;
        doc.push_str(&format!(
            "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
        ));
    }
    let e = super::call("yamldecode", vec![Value::String(doc)], &FileAccess::default()).unwrap_err();
    assert!(e.contains("expands to more than"), "{e}");
}

#[test]
fn yamlencode() {
    check_str(r#"yamlencode({"a":"b", "c":"d"})"#, "\"a\": \"b\"\n\"c\": \"d\"\n");
    check_str(r#"yamlencode({"foo":[1, 2, 3], "bar": "baz"})"#, "\"bar\": \"baz\"\n\"foo\":\n- 1\n- 2\n- 3\n");
    check_str(
        r#"yamlencode({"foo":[1, {"a":"b","c":"d"}, 3], "bar": "baz"})"#,
        "\"bar\": \"baz\"\n\"foo\":\n- 1\n- \"a\": \"b\"\n  \"c\": \"d\"\n- 3\n",
    );
    check_str(
        r#"yamlencode({a = {b = [[1, 2], []], c = {}}, d = null, e = true})"#,
        "\"a\":\n  \"b\":\n  - - 1\n    - 2\n  - []\n  \"c\": {}\n\"d\": null\n\"e\": true\n",
    );
    check_str(r#"yamlencode({s = "line1\nline2"})"#, "\"s\": |-\n  line1\n  line2\n");
    check_str(r#"yamlencode("tab\there")"#, "\"tab\\there\"\n");
    // What it writes reads back the same.
    check(r#"yamldecode(yamlencode({x = [1, "two", {y = "a\nb\n"}], z = false}))"#, r#"{x = [1, "two", {y = "a\nb\n"}], z = false}"#);
    fails("yamlencode()", "not enough function arguments");
}

// ---- hashes and crypto

#[test]
fn hashes() {
    check_str(r#"md5("hello world")"#, "5eb63bbbe01eeed093cb22bb8f5acdc3");
    check_str(r#"sha1("hello world")"#, "2aae6c35c94fcfb415dbe95f408b9ce91ee846ed");
    check_str(r#"sha256("hello world")"#, "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9");
    check_str(
        r#"sha512("hello world")"#,
        "309ecc489c12d6eb4cc40f50c902f2b4d0ed77ee511a7c7a9bcd3ca86d4cd86f989dd35bc5ff499670da34255b45b0cfd830e81f605dcf7dc5542e93ae9cd76f",
    );
    fails("md5([])", "a string is required");
    fails("sha1()", "not enough function arguments");
    fails("sha256({})", "a string is required");
    fails("sha512(null)", "a string is required");
}

#[test]
fn bcrypt() {
    let Ok(Value::String(hash)) = eval(r#"bcrypt("hello world")"#) else { panic!("bcrypt failed") };
    assert!(hash.starts_with("$2a$10$") && hash.len() == 60, "{hash}");
    assert!(::bcrypt::verify("hello world", &hash).unwrap());
    let Ok(Value::String(cheap)) = eval(r#"bcrypt("hello world", 4)"#) else { panic!("bcrypt failed") };
    assert!(cheap.starts_with("$2a$04$"), "{cheap}");
    assert!(::bcrypt::verify("hello world", &cheap).unwrap());
    assert!(!::bcrypt::verify("hello there", &cheap).unwrap());
    fails(r#"bcrypt("x", 32)"#, "cost 32 is outside allowed range (4,31)");
    fails(r#"bcrypt("x", 20)"#, "above 15");
    fails(r#"bcrypt("x", 4, 5)"#, "bcrypt() takes no more than two arguments");
}

#[test]
fn bcrypt_in_a_loop_runs_out_of_budget_instead_of_stalling() {
    // 1024 hashes at cost 15 would take about an hour; the budget stops it after one.
    let started = std::time::Instant::now();
    fails(r#"[for i in range(1024) : bcrypt("x", 15)]"#, "too expensive");
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

#[test]
fn rsadecrypt() {
    let key = include_str!("testdata/rsa-test-key.pem");
    let ciphertext = include_str!("testdata/rsa-hello.b64").trim();
    let files = FileAccess::default();
    let call = |c: &str, k: &str| super::call("rsadecrypt", vec![Value::from(c), Value::from(k)], &files);
    assert_eq!(call(ciphertext, key), Ok(Value::from("Hello, world!")));
    assert!(call("not base64!", key).unwrap_err().contains("cipher text must be base64-encoded"));
    assert!(call(ciphertext, "no pem here").unwrap_err().contains("failed to parse key: no key found"));
    assert!(call("aGVsbG8=", key).unwrap_err().contains("crypto/rsa"));
}

// ---- dates

#[test]
fn formatdate() {
    check_str(r#"formatdate("DD MMM YYYY hh:mm ZZZ", "2018-01-02T23:12:01Z")"#, "02 Jan 2018 23:12 UTC");
    check_str(r#"formatdate("EEEE, DD-MMM-YY hh:mm:ss ZZZ", "2018-01-02T23:12:01Z")"#, "Tuesday, 02-Jan-18 23:12:01 UTC");
    check_str(r#"formatdate("EEE, DD MMM YYYY hh:mm:ss ZZZ", "2018-01-02T23:12:01-08:00")"#, "Tue, 02 Jan 2018 23:12:01 -0800");
    check_str(r#"formatdate("MMM DD, YYYY", "2018-01-02T23:12:01Z")"#, "Jan 02, 2018");
    check_str(r#"formatdate("HH:mmaa", "2018-01-02T23:12:01Z")"#, "11:12pm");
    check_str(r#"formatdate("h'h'mm", "2018-01-02T23:12:01-08:00")"#, "23h12");
    check_str(r#"formatdate("H 'o''clock'", "2018-01-02T23:12:01-08:00")"#, "11 o'clock");
    check_str(r#"formatdate("M/D Z ZZZZ ZZZZZ MMMM", "2018-07-04T05:06:07+05:30")"#, "7/4 +05:30 +0530 +05:30 July");
    fails(r#"formatdate("YYY", "2018-01-02T23:12:01Z")"#, "invalid date format verb \"YYY\": year must either be \"YY\" or \"YYYY\"");
    fails(r#"formatdate("'open", "2018-01-02T23:12:01Z")"#, "unterminated literal '");
    fails(r#"formatdate("YYYY", "2018-01-02")"#, "not a valid RFC3339 timestamp");
    fails(r#"formatdate("YYYY", "2018-02-30T00:00:00Z")"#, "day out of range");
}

#[test]
fn timeadd() {
    check_str(r#"timeadd("2017-11-22T00:00:00Z", "10m")"#, "2017-11-22T00:10:00Z");
    check_str(r#"timeadd("2017-11-22T00:00:00+01:00", "-1h30m")"#, "2017-11-21T22:30:00+01:00");
    check_str(r#"timeadd("2020-02-28T23:00:00Z", "24h")"#, "2020-02-29T23:00:00Z");
    fails(r#"timeadd("2017-11-22T00:00:00Z", "10")"#, "time: missing unit in duration \"10\"");
    fails(r#"timeadd("2017-11-22T00:00:00Z", "10y")"#, "time: unknown unit \"y\" in duration \"10y\"");
    fails(r#"timeadd("yesterday", "1h")"#, "not a valid RFC3339 timestamp");
}

// ---- networks

#[test]
fn cidrhost() {
    check_str(r#"cidrhost("10.12.127.0/20", 16)"#, "10.12.112.16");
    check_str(r#"cidrhost("10.12.127.0/20", 268)"#, "10.12.113.12");
    check_str(r#"cidrhost("fd00:fd12:3456:7890:00a2::/72", 34)"#, "fd00:fd12:3456:7890::22");
    check_str(r#"cidrhost("10.1.2.240/28", 1)"#, "10.1.2.241");
    check_str(r#"cidrhost("10.1.2.240/28", 14)"#, "10.1.2.254");
    check_str(r#"cidrhost("10.1.2.240/28", -1)"#, "10.1.2.255");
    fails(r#"cidrhost("10.1.2.240/28", 16)"#, "prefix of 28 does not accommodate a host numbered 16");
    fails(r#"cidrhost("10.1.2.240", 1)"#, "invalid CIDR expression");
}

#[test]
fn cidrnetmask() {
    check_str(r#"cidrnetmask("172.16.0.0/12")"#, "255.240.0.0");
    check_str(r#"cidrnetmask("10.0.0.0/0")"#, "0.0.0.0");
    fails(r#"cidrnetmask("172.16.0.0/33")"#, "invalid CIDR expression");
}

#[test]
fn cidrsubnet() {
    check_str(r#"cidrsubnet("172.16.0.0/12", 4, 2)"#, "172.18.0.0/16");
    check_str(r#"cidrsubnet("10.1.2.0/24", 4, 15)"#, "10.1.2.240/28");
    check_str(r#"cidrsubnet("fd00:fd12:3456:7890::/56", 16, 162)"#, "fd00:fd12:3456:7800:a200::/72");
    fails(r#"cidrsubnet("10.1.2.0/24", 4, 16)"#, "prefix extension of 4 does not accommodate a subnet numbered 16");
    fails(r#"cidrsubnet("10.1.2.0/24", 9, 0)"#, "insufficient address space to extend prefix of 24 by 9");
    fails(r#"cidrsubnet("fd00::/8", 33, 0)"#, "may not extend prefix by more than 32 bits");
}

#[test]
fn cidrsubnets() {
    check(r#"cidrsubnets("10.1.0.0/16", 4, 4, 8, 4)"#, r#"["10.1.0.0/20", "10.1.16.0/20", "10.1.32.0/24", "10.1.48.0/20"]"#);
    check(
        r#"cidrsubnets("fd00:fd12:3456:7890::/56", 16, 16, 16, 32)"#,
        r#"["fd00:fd12:3456:7800::/72", "fd00:fd12:3456:7800:100::/72", "fd00:fd12:3456:7800:200::/72", "fd00:fd12:3456:7800:300::/88"]"#,
    );
    check(
        r#"[for cidr_block in cidrsubnets("10.0.0.0/8", 8, 8, 8, 8) : cidrsubnets(cidr_block, 4, 4)]"#,
        r#"[["10.0.0.0/20", "10.0.16.0/20"], ["10.1.0.0/20", "10.1.16.0/20"], ["10.2.0.0/20", "10.2.16.0/20"], ["10.3.0.0/20", "10.3.16.0/20"]]"#,
    );
    check(r#"cidrsubnets("10.0.0.0/8")"#, "[]");
    fails(
        r#"cidrsubnets("10.0.0.0/30", 1, 1, 1)"#,
        "not enough remaining address space for a subnet with a prefix of 31 bits after 10.0.0.2/31",
    );
    fails(r#"cidrsubnets("10.0.0.0/30", 3)"#, "would extend prefix to 33 bits, which is too long for an IPv4 address");
    fails(r#"cidrsubnets("10.0.0.0/8", 0)"#, "must extend prefix by at least one bit");
}

// ---- uuids

#[test]
fn uuidv4() {
    let Ok(Value::String(a)) = eval("uuidv4()") else { panic!("uuidv4 failed") };
    let Ok(Value::String(b)) = eval("uuidv4()") else { panic!("uuidv4 failed") };
    let parsed = ::uuid::Uuid::parse_str(&a).unwrap();
    assert_eq!(parsed.get_version_num(), 4);
    assert_ne!(a, b);
    fails("uuidv4(1)", "too many function arguments");
}

#[test]
fn uuidv5() {
    check_str(r#"uuidv5("dns", "nomadproject.io")"#, "d2616d48-e1cb-5b87-8a8c-46355decc76a");
    check_str(r#"uuidv5("url", "https://nomadproject.io/")"#, "a1572394-3948-5251-b0c7-b4ded43587b4");
    check_str(r#"uuidv5("oid", "1.3.6.1.4")"#, "af9d40a5-7a36-5c07-b23a-851cd99fbfa5");
    check_str(r#"uuidv5("x500", "CN=Example,C=GB")"#, "84e09961-4aa4-57f8-95b7-03edb1073253");
    check_str(r#"uuidv5("6ba7b810-9dad-11d1-80b4-00c04fd430c8", "nomadproject.io")"#, "d2616d48-e1cb-5b87-8a8c-46355decc76a");
    check_str(r#"uuidv5("743ac3c0-3bf7-4a5b-9e6c-59360447c757", "LIBS:diskfont.library")"#, "ede1a974-df7e-5f17-84b9-76208818b2c8");
    fails(r#"uuidv5("nope", "x")"#, "uuidv5() doesn't support namespace nope");
}

// ---- files

/// A job directory like the docs' `pkr-consul` tree.
fn job_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::create_dir_all(p.join("linux/files")).unwrap();
    std::fs::create_dir_all(p.join("linux/scripts")).unwrap();
    for f in [
        "build-linux.pkr.hcl",
        "linux/files/hello.txt",
        "linux/files/world.txt",
        "linux/scripts/script-1-install.sh",
        "linux/scripts/script-2-setup.sh",
    ] {
        std::fs::write(p.join(f), "x").unwrap();
    }
    std::fs::write(p.join("hello.txt"), "Hello World").unwrap();
    dir
}

#[track_caller]
fn check_in(dir: &Path, src: &str, want: &str) {
    let want = eval(want).unwrap();
    assert_eq!(eval_in(src, Some(dir)), Ok(want), "{src}");
}

#[test]
fn file_and_filebase64() {
    let dir = job_dir();
    check_in(dir.path(), r#"file("./hello.txt")"#, r#""Hello World""#);
    check_in(dir.path(), r#"filebase64("hello.txt")"#, r#""SGVsbG8gV29ybGQ=""#);
    let abs = dir.path().join("hello.txt");
    check_in(dir.path(), &format!("file(\"{}\")", abs.display()), r#""Hello World""#);
    std::fs::write(dir.path().join("binary"), [0xff, 0xfe]).unwrap();
    let e = eval_in(r#"file("binary")"#, Some(dir.path())).unwrap_err();
    assert!(e.contains("contents of binary are not valid UTF-8; use the filebase64 function"), "{e}");
    let e = eval_in(r#"file("missing.txt")"#, Some(dir.path())).unwrap_err();
    assert!(e.contains("no file exists at") && e.contains("missing.txt"), "{e}");
    let e = eval_in(r#"file("linux")"#, Some(dir.path())).unwrap_err();
    assert!(e.contains("is not a regular file, but \"d"), "{e}");
}

#[test]
fn file_refuses_a_fifo_without_opening_it() {
    let dir = job_dir();
    let fifo = dir.path().join("pipe");
    nix_mkfifo(&fifo);
    // Opening a FIFO for reading blocks until a writer comes; the check must come first.
    let e = eval_in(r#"file("pipe")"#, Some(dir.path())).unwrap_err();
    assert!(e.contains("is not a regular file, but \"p"), "{e}");
    let e = eval_in(r#"fileexists("pipe")"#, Some(dir.path())).unwrap_err();
    assert!(e.contains("is not a regular file"), "{e}");
}

fn nix_mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(status.success());
}

#[test]
fn file_refuses_a_file_larger_than_a_job_file() {
    let dir = job_dir();
    let big = std::fs::File::create(dir.path().join("big")).unwrap();
    big.set_len(crate::jobspec::MAX_JOBSPEC_BYTES as u64 + 1).unwrap();
    let e = eval_in(r#"file("big")"#, Some(dir.path())).unwrap_err();
    assert!(e.contains("a file read by a job file may be at most"), "{e}");
}

#[test]
fn fileexists() {
    let dir = job_dir();
    check_in(dir.path(), r#"fileexists("./hello.txt")"#, "true");
    check_in(dir.path(), r#"fileexists("nope.txt")"#, "false");
    check_in(dir.path(), r#"fileexists("hello.txt") ? file("hello.txt") : "default""#, r#""Hello World""#);
    let e = eval_in(r#"fileexists("linux")"#, Some(dir.path())).unwrap_err();
    assert!(e.contains("is not a regular file"), "{e}");
}

#[test]
fn fileset() {
    let dir = job_dir();
    let d = dir.path();
    check_in(d, r#"fileset(".", "*.hcl")"#, r#"["build-linux.pkr.hcl"]"#);
    check_in(d, r#"fileset(".", "linux/scripts/*")"#, r#"["linux/scripts/script-1-install.sh", "linux/scripts/script-2-setup.sh"]"#);
    check_in(d, r#"fileset("linux", "files/{hello,world}.txt")"#, r#"["files/hello.txt", "files/world.txt"]"#);
    check_in(d, r#"fileset("./linux/files", "*")"#, r#"["hello.txt", "world.txt"]"#);
    check_in(
        d,
        r#"fileset("./linux", "**")"#,
        r#"["files/hello.txt", "files/world.txt", "scripts/script-1-install.sh", "scripts/script-2-setup.sh"]"#,
    );
    check_in(d, r#"fileset(".", "**/script-?-*.sh")"#, r#"["linux/scripts/script-1-install.sh", "linux/scripts/script-2-setup.sh"]"#);
    check_in(d, r#"fileset(".", "linux/[fx]iles/h*")"#, r#"["linux/files/hello.txt"]"#);
    check_in(d, r#"fileset("nowhere", "*")"#, "[]");
    let e = eval_in(r#"fileset(".", "[abc")"#, Some(d)).unwrap_err();
    assert!(e.contains("failed to glob pattern"), "{e}");
}

#[test]
fn fileset_is_bounded_in_depth() {
    let dir = tempfile::tempdir().unwrap();
    let mut deep = dir.path().to_path_buf();
    for i in 0..40 {
        deep.push(format!("d{i}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("f"), "x").unwrap();
    let e = eval_in(r#"fileset(".", "**")"#, Some(dir.path())).unwrap_err();
    assert!(e.contains("directories deep"), "{e}");
}

#[test]
fn path_functions() {
    let dir = job_dir();
    let d = dir.path();
    check_in(d, r#"basename("foo/bar/baz.txt")"#, r#""baz.txt""#);
    check_in(d, r#"basename("foo/bar/")"#, r#""bar""#);
    check_in(d, r#"dirname("foo/bar/baz.txt")"#, r#""foo/bar""#);
    check_in(d, r#"dirname("baz.txt")"#, r#"".""#);
    let cwd = std::env::current_dir().unwrap();
    check_in(d, r#"abspath("nomad.txt")"#, &format!("\"{}/nomad.txt\"", cwd.display()));
    check_in(d, r#"abspath("/a/./b/../c")"#, r#""/a/c""#);
    check_in(d, r#"pathexpand("/etc/resolv.conf")"#, r#""/etc/resolv.conf""#);
    if let Ok(home) = std::env::var("HOME") {
        check_in(d, r#"pathexpand("~/.ssh/id_rsa")"#, &format!("\"{home}/.ssh/id_rsa\""));
    }
    let e = eval_in(r#"pathexpand("~root/x")"#, Some(d)).unwrap_err();
    assert!(e.contains("cannot expand user-specific home dir"), "{e}");
    assert!(eval_in("basename([])", Some(d)).unwrap_err().contains("a string is required"));
    assert!(eval_in("dirname()", Some(d)).unwrap_err().contains("not enough function arguments"));
}

#[test]
fn filesystem_functions_are_disabled_unless_allowed() {
    for call in [
        r#"file("x")"#,
        r#"filebase64("x")"#,
        r#"fileexists("x")"#,
        r#"fileset(".", "*")"#,
        r#"abspath("x")"#,
        r#"basename("x")"#,
        r#"dirname("x")"#,
        r#"pathexpand("x")"#,
    ] {
        let e = eval(call).unwrap_err();
        assert!(e.ends_with("(): filesystem function disabled"), "{call}: {e}");
    }
}
