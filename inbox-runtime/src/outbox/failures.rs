//! What makes dead messages one failure group, and how a group's retry or
//! discard finds its members: the failure (an error with its ids and
//! numbers masked), a `LIKE` pattern every member's error matches, and
//! the members among the candidates it admits.

use crate::backend::outbox::{DeadRow, DeadWhere, Op};
use crate::error::InboxError;

/// The longest failure a group keeps (characters; the rest is cut).
const MAX_FAILURE: usize = 240;

/// How many members a group's retry or discard takes, at most: one
/// statement names them all (under every backend's limit of bound
/// values), so that it changes all or nothing.
const MAX_GROUP_ACTION: usize = 10_000;

/// How many candidates (the destination's dead messages the group's
/// pattern admits) a group's retry or discard reads, at most.
const MAX_CANDIDATES: i64 = 100_000;

/// `error` with its ids and numbers masked: each word (letters, digits and
/// `-_.:`) that holds a digit becomes `#`; runs of white space become one
/// space; other control characters (NUL) `?`; at most [`MAX_FAILURE`]
/// characters.
pub(super) fn failure_of(error: &str) -> String {
    fn word(out: &mut String, word: &mut String) {
        if word.chars().any(|c| c.is_ascii_digit()) {
            out.push('#');
        } else {
            out.push_str(word);
        }
        word.clear();
    }
    let mut out = String::new();
    let mut current = String::new();
    for c in error.chars() {
        if c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | ':') {
            current.push(c);
            continue;
        }
        word(&mut out, &mut current);
        if c.is_whitespace() {
            if !out.is_empty() && !out.ends_with(' ') {
                out.push(' ');
            }
        } else if c.is_control() {
            out.push('?');
        } else {
            out.push(c);
        }
    }
    word(&mut out, &mut current);
    let out = out.trim_end();
    match out.char_indices().nth(MAX_FAILURE) {
        Some((cut, _)) => out[..cut].to_owned(),
        None => out.to_owned(),
    }
}

/// A `LIKE` pattern on the last error as it is (escaped with `!`) that
/// every error of `failure` matches, and maybe others (the members are
/// then checked one by one): the masks, the spaces and the `?` of a
/// control character are wildcards; the rest is taken as it is (no case
/// folding, which SQL and Rust do differently).
fn pattern(failure: &str) -> String {
    let mut out = String::from("%");
    // Whether `out` ends with a wildcard `%` (not an escaped one).
    let mut any = true;
    for c in failure.chars() {
        if matches!(c, '#' | ' ' | '?') {
            if !any {
                out.push('%');
            }
            any = true;
            continue;
        }
        any = false;
        match c {
            '%' | '_' | '!' => {
                out.push('!');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    if !any {
        out.push('%');
    }
    out
}

/// The read of a group's candidates: the dead messages `within` selects
/// to its destination whose error [`pattern`] admits (at most
/// [`MAX_CANDIDATES`]); `None` when `within` names another destination.
pub(super) fn members(destination: &str, failure: &str, within: DeadWhere) -> Option<Op> {
    let mut which = within;
    if which
        .destination
        .as_deref()
        .is_some_and(|d| d != destination)
    {
        return None;
    }
    which.destination = Some(destination.to_owned());
    which.failure_like = Some(pattern(failure));
    Some(Op::DeadFailures {
        which,
        limit: MAX_CANDIDATES,
    })
}

/// The selection of the group's members among `rows` (those whose
/// failure is the group's, by their ids); refused when there may be more
/// candidates than were read, or more members than one statement takes.
pub(super) fn chosen(
    rows: Vec<DeadRow>,
    destination: &str,
    failure: &str,
) -> Result<DeadWhere, InboxError> {
    if rows.len() as i64 >= MAX_CANDIDATES {
        return Err(InboxError::InvalidArgument(
            "the failure group's retry or discard read 100000 dead messages that may be members, and there may be more: narrow the filter (by time, say) and act again; nothing was changed",
        ));
    }
    let ids: Vec<String> = rows
        .into_iter()
        .filter(|row| {
            row.destination == destination
                && failure_of(row.last_error.as_deref().unwrap_or("")) == failure
        })
        .map(|row| row.id)
        .collect();
    if ids.len() > MAX_GROUP_ACTION {
        return Err(InboxError::InvalidArgument(
            "the failure group has more than 10000 members, more than one retry or discard takes: narrow the filter (by time, say) and act again; nothing was changed",
        ));
    }
    Ok(DeadWhere {
        ids: Some(ids),
        ..DeadWhere::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_numbers_are_masked() {
        for (error, failure) in [
            ("timeout after 30s on 10.0.0.7:9092", "timeout after # on #"),
            (
                "message 3f2a9c1e-0b7d-4c55-9a1e-2b6f0d4e8a11 refused:   NOT_FOUND",
                "message # refused: NOT_FOUND",
            ),
            ("order-7 (HTTP 503)", "# (HTTP #)"),
            ("no route to 'orders'", "no route to 'orders'"),
            ("  ", ""),
            ("Zeitüberschreitung nach 5 s", "Zeitüberschreitung nach # s"),
            ("bad\0frame", "bad?frame"),
        ] {
            assert_eq!(failure_of(error), failure, "{error}");
        }
        let long = "x ".repeat(1_000);
        assert_eq!(failure_of(&long).chars().count(), MAX_FAILURE);
    }

    #[test]
    fn the_pattern_admits_every_member() {
        for (failure, like) in [
            ("timeout after # on #", "%timeout%after%on%"),
            ("#% _done_!", "%!%%!_done!_!!%"),
            ("refused: #% of # used", "%refused:%!%%of%used%"),
            ("100%", "%100!%%"),
            ("Zeitüberschreitung", "%Zeitüberschreitung%"),
            ("bad?frame", "%bad%frame%"),
            ("", "%"),
        ] {
            assert_eq!(pattern(failure), like, "{failure}");
        }
    }

    #[test]
    fn the_members_are_those_of_the_failure() {
        let row = |id: &str, error: &str| DeadRow {
            id: id.into(),
            destination: "orders".into(),
            ordering_key: None,
            attempts: 5,
            last_error: Some(error.into()),
            created_at: 0,
            dead_at: 0,
            payload: None,
            headers: None,
        };
        let chosen = chosen(
            vec![
                row("c", "timeout after 9s"),
                row("x", "timeout after many"),
                row("a", "timeout after 1s"),
            ],
            "orders",
            "timeout after #",
        )
        .expect("chosen");
        assert_eq!(chosen.ids, Some(vec!["c".to_owned(), "a".to_owned()]));
    }
}
