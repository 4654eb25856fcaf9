//! The rollout event stream judged at the end of a chaos run: every event a management cluster stored
//! reaches the hub exactly once, and the hub keeps each cluster's events in the order the cluster stored
//! them. Pure over the message ids read from the streams.

use std::collections::{BTreeMap, BTreeSet};

/// What is wrong with the hub's copy, one line per finding.
pub fn stream_findings(
    own: &BTreeMap<String, Vec<String>>,
    hub: &[(String, String)],
) -> Vec<String> {
    let mut findings = Vec::new();
    for (cluster, ids) in own {
        let (unique, stored_twice) = distinct(ids.iter());
        findings.extend(
            stored_twice
                .iter()
                .map(|id| format!("{cluster}: event {id} stored twice in its own stream")),
        );
        let at_hub: Vec<&String> = hub
            .iter()
            .filter(|(source, _)| source == cluster)
            .map(|(_, id)| id)
            .collect();
        let (seen, twice_at_hub) = distinct(at_hub.iter().copied());
        findings.extend(
            twice_at_hub
                .iter()
                .map(|id| format!("{cluster}: event {id} twice at the hub")),
        );
        let missing: Vec<&String> = ids.iter().filter(|id| !seen.contains(id)).collect();
        if !missing.is_empty() {
            findings.push(format!(
                "{cluster}: {} events never reached the hub, the first {:?}",
                missing.len(),
                missing.first()
            ));
        }
        let both: BTreeSet<&String> = unique.intersection(&seen).copied().collect();
        if first_order(at_hub.iter().copied(), &both) != first_order(ids.iter(), &both) {
            findings.push(format!(
                "{cluster}: the hub holds its events in another order"
            ));
        }
    }
    findings
}

/// The distinct ids, and every repeat of one (in order).
fn distinct<'a>(ids: impl Iterator<Item = &'a String>) -> (BTreeSet<&'a String>, Vec<&'a String>) {
    let mut distinct = BTreeSet::new();
    let repeats = ids.filter(|id| !distinct.insert(*id)).collect();
    (distinct, repeats)
}

/// `ids` in the order each first appears, of those in `both` only.
fn first_order<'a>(
    ids: impl Iterator<Item = &'a String>,
    both: &BTreeSet<&String>,
) -> Vec<&'a String> {
    let mut taken = BTreeSet::new();
    ids.filter(|id| both.contains(id) && taken.insert(*id))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn hub(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(c, id)| ((*c).to_owned(), (*id).to_owned()))
            .collect()
    }

    #[test]
    fn the_hub_holds_each_event_once_in_its_clusters_order() {
        let own = BTreeMap::from([
            ("canary".to_owned(), ids(&["a", "b", "c"])),
            ("prod".to_owned(), ids(&["x", "y"])),
        ]);
        let good = hub(&[
            ("canary", "a"),
            ("prod", "x"),
            ("canary", "b"),
            ("prod", "y"),
            ("canary", "c"),
        ]);
        assert!(stream_findings(&own, &good).is_empty());

        let twice = hub(&[
            ("canary", "a"),
            ("canary", "b"),
            ("canary", "b"),
            ("canary", "c"),
            ("prod", "x"),
            ("prod", "y"),
        ]);
        assert_eq!(
            stream_findings(&own, &twice),
            ["canary: event b twice at the hub"]
        );

        let lost_and_swapped = hub(&[
            ("canary", "b"),
            ("canary", "a"),
            ("prod", "x"),
            ("prod", "y"),
        ]);
        let findings = stream_findings(&own, &lost_and_swapped);
        assert_eq!(findings.len(), 2, "{findings:?}");
        assert!(findings[0].starts_with("canary: 1 events never reached the hub"));
        assert_eq!(
            findings[1],
            "canary: the hub holds its events in another order"
        );
    }
}
