//! Turning the ID prefix a user typed into one object, through the list
//! endpoints' `prefix=` parameter. No match and several matches are errors
//! (exit 1); several matches list the candidates.

use nomad_proto::{AllocListStub, Evaluation, JobListStub, NodeListStub};

use super::api::{Query, encode_path};
use super::format::now_nanos;
use super::{Ctx, Failure, tables};

/// The outcome of matching a prefix against candidates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match<T> {
    /// Nothing matched.
    None,
    /// Exactly one candidate, or one whose ID equals the prefix.
    One(T),
    /// Several candidates.
    Many(Vec<T>),
}

/// Picks among `items` (already filtered by prefix on the server): one item, an exact ID
/// match among several, nothing, or the ambiguous list.
pub fn choose<T>(prefix: &str, mut items: Vec<T>, id: impl Fn(&T) -> &str) -> Match<T> {
    // Servers filter by prefix; filter again so a server that ignores `prefix=` still works.
    items.retain(|i| id(i).starts_with(prefix));
    match items.len() {
        0 => Match::None,
        1 => Match::One(items.remove(0)),
        _ => match items.iter().position(|i| id(i) == prefix) {
            Some(p) => Match::One(items.swap_remove(p)),
            None => Match::Many(items),
        },
    }
}

/// UUID-keyed objects need at least two characters, as in Nomad.
pub fn check_min_len(prefix: &str) -> Result<(), Failure> {
    if prefix.chars().count() < 2 {
        return Err(Failure::new("Identifier must contain at least two characters."));
    }
    Ok(())
}

/// Lists with `namespace=*` unless the user picked a namespace: IDs are unique cluster-wide.
fn all_namespaces(ctx: &Ctx, q: Query) -> Query {
    if ctx.client.config().namespace.is_some() { q } else { q.param("namespace", "*") }
}

/// The job whose ID starts with `prefix`.
pub async fn job(ctx: &Ctx, prefix: &str) -> Result<JobListStub, Failure> {
    let list = ctx
        .client
        .get::<Vec<JobListStub>>("/v1/jobs", &Query::new().prefix(prefix))
        .await
        .map_err(|e| Failure::new(format!("Error querying job: {e}")))?
        .value;
    match choose(prefix, list, |j| j.id.as_str()) {
        Match::None => Err(Failure::new(format!("No job(s) with prefix or id \"{prefix}\" found"))),
        Match::One(j) => Ok(j),
        Match::Many(list) => Err(Failure::new(format!("Prefix matched multiple jobs\n\n{}", tables::jobs(&list)))),
    }
}

/// The node whose ID starts with `prefix`.
pub async fn node(ctx: &Ctx, prefix: &str) -> Result<NodeListStub, Failure> {
    check_min_len(prefix)?;
    let list = ctx
        .client
        .get::<Vec<NodeListStub>>("/v1/nodes", &Query::new().prefix(prefix))
        .await
        .map_err(|e| Failure::new(format!("Error querying node info: {e}")))?
        .value;
    match choose(prefix, list, |n| n.id.as_str()) {
        Match::None => Err(Failure::new(format!("No node(s) with prefix \"{prefix}\" found"))),
        Match::One(n) => Ok(n),
        Match::Many(list) => {
            Err(Failure::new(format!("Prefix matched multiple nodes\n\n{}", tables::nodes(&list, ctx.id_len(true), false))))
        }
    }
}

/// The allocation whose ID starts with `prefix`.
pub async fn alloc(ctx: &Ctx, prefix: &str) -> Result<AllocListStub, Failure> {
    check_min_len(prefix)?;
    let q = all_namespaces(ctx, Query::new().prefix(prefix).param("task_states", "false"));
    let list = ctx
        .client
        .get::<Vec<AllocListStub>>("/v1/allocations", &q)
        .await
        .map_err(|e| Failure::new(format!("Error querying allocation: {e}")))?
        .value;
    match choose(prefix, list, |a| a.id.as_str()) {
        Match::None => Err(Failure::new(format!("No allocation(s) with prefix or id \"{prefix}\" found"))),
        Match::One(a) => Ok(a),
        Match::Many(list) => Err(Failure::new(format!(
            "Prefix matched multiple allocations\n\n{}",
            tables::alloc_candidates(&list, ctx.id_len(true), now_nanos())
        ))),
    }
}

/// The full allocation whose ID starts with `prefix`.
pub async fn full_alloc(ctx: &Ctx, prefix: &str) -> Result<nomad_proto::Allocation, Failure> {
    let stub = alloc(ctx, prefix).await?;
    ctx.client
        .get::<nomad_proto::Allocation>(&format!("/v1/allocation/{}", encode_path(&stub.id)), &Query::new())
        .await
        .map(|a| a.value)
        .map_err(|e| Failure::new(format!("Error querying allocation: {e}")))
}

/// The evaluation whose ID starts with `prefix`.
pub async fn eval(ctx: &Ctx, prefix: &str) -> Result<Evaluation, Failure> {
    check_min_len(prefix)?;
    let q = all_namespaces(ctx, Query::new().prefix(prefix));
    let list = ctx
        .client
        .get::<Vec<Evaluation>>("/v1/evaluations", &q)
        .await
        .map_err(|e| Failure::new(format!("Error querying evaluation: {e}")))?
        .value;
    match choose(prefix, list, |e| e.id.as_str()) {
        Match::None => Err(Failure::new(format!("No evaluation(s) with prefix or id \"{prefix}\" found"))),
        Match::One(e) => Ok(e),
        Match::Many(list) => {
            Err(Failure::new(format!("Prefix matched multiple evaluations\n\n{}", tables::evals(&list, ctx.id_len(true)))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn one_candidate_wins() {
        assert_eq!(choose("ab", ids(&["abc"]), |s| s), Match::One("abc".to_string()));
    }

    #[test]
    fn an_exact_id_beats_longer_ids_with_the_same_prefix() {
        assert_eq!(choose("web", ids(&["web", "web2"]), |s| s), Match::One("web".to_string()));
    }

    #[test]
    fn several_candidates_are_ambiguous_and_none_is_none() {
        assert_eq!(choose("we", ids(&["web", "web2"]), |s| s), Match::Many(ids(&["web", "web2"])));
        assert_eq!(choose("x", ids(&[]), |s| s), Match::None);
    }

    #[test]
    fn candidates_the_server_should_have_filtered_are_dropped() {
        assert_eq!(choose("ab", ids(&["zz", "abd"]), |s| s), Match::One("abd".to_string()));
    }

    #[test]
    fn uuid_prefixes_need_two_characters() {
        assert!(check_min_len("a").unwrap_err().message.contains("at least two characters"));
        assert!(check_min_len("ab").is_ok());
    }
}
