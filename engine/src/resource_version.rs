//! Which of two observations of one object is newer, by resourceVersion.
//!
//! A write's response and a watch's events reach an actor by different paths, so a response can arrive
//! after the watch already showed a later state of the object (its status moved on). Taking the response
//! then would put an older object over a newer one, and no further event comes to correct it. An etcd-backed
//! apiserver's resourceVersion is etcd's revision, which grows with every write; a version that does not
//! read as such an integer is never called newer, so the watch stays the authority.

/// Whether `response` (the version a write returned) is newer than `watched` (the last version the watch
/// delivered, `None` when it has delivered none).
pub fn response_is_newer(response: Option<&str>, watched: Option<&str>) -> bool {
    let Some(response) = response.and_then(|v| v.parse::<u64>().ok()) else {
        return false;
    };
    match watched {
        None => true,
        Some(watched) => watched
            .parse::<u64>()
            .is_ok_and(|watched| response > watched),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_older_than_the_watch_does_not_replace_it() {
        assert!(!response_is_newer(Some("41"), Some("42")));
        assert!(
            !response_is_newer(Some("42"), Some("42")),
            "the echo itself"
        );
        assert!(response_is_newer(Some("43"), Some("42")));
        assert!(
            response_is_newer(Some("100"), Some("99")),
            "numerically, not by text"
        );
        assert!(response_is_newer(Some("7"), None), "nothing watched yet");
    }

    #[test]
    fn versions_that_are_not_integers_leave_the_watch_in_charge() {
        assert!(!response_is_newer(None, None));
        assert!(!response_is_newer(Some("abc"), None));
        assert!(!response_is_newer(Some("43"), Some("x")));
    }
}
