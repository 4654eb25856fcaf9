//! Parses an image reference (`[registry[:port]/]repository[:tag][@digest]`) into the registry client's
//! `Reference`, with the distribution grammar's rules and Docker Hub's defaults (`docker.io`, `library/`,
//! tag `latest`).
//!
//! Why not the client's own parser: it matches one anchored regex whose tag part repeats a Unicode word
//! class 128 times; compiling it took 7.4 MB of the manager's heap (a heap profile of 500 hosted clusters),
//! kept for the process's life. This parser holds nothing. It accepts what the client's parser accepts
//! and splits it the same way (a property test holds it to that), except tags with non-ASCII letters,
//! which the OCI distribution spec does not allow and no registry serves.

use oci_client::Reference;

const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_LEGACY: &str = "index.docker.io";
const OFFICIAL_IMAGES: &str = "library";
const DEFAULT_TAG: &str = "latest";
/// The longest repository name a registry takes.
const MAX_REPOSITORY: usize = 255;
/// The longest tag.
const MAX_TAG: usize = 128;

/// Why a string is not an image reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("the reference is empty")]
    Empty,
    #[error("the repository name {0:?} is not lowercase letters and digits joined by '.', '_', '__' or dashes, in '/'-separated parts (after an optional registry host[:port]/)")]
    Name(String),
    #[error("the tag {0:?} is not 1 to {MAX_TAG} letters, digits, '_', '.' and '-' starting with a letter, digit or '_'")]
    Tag(String),
    #[error("the digest {0:?} is not <algorithm>:<hex> (sha256 with 64 hex digits, sha384 with 96, sha512 with 128)")]
    Digest(String),
    #[error("the repository name is {0} characters long, more than {MAX_REPOSITORY}")]
    RepositoryTooLong(usize),
}

/// Parses `image`; see the module documentation.
pub fn parse_reference(image: &str) -> Result<Reference, ReferenceError> {
    if image.is_empty() {
        return Err(ReferenceError::Empty);
    }
    let (named, digest) = match image.split_once('@') {
        Some((named, digest)) => (named, Some(digest)),
        None => (image, None),
    };
    // A tag follows the last ':' after the last '/'; a ':' before a '/' is a registry's port.
    let path_start = named.rfind('/').map_or(0, |slash| slash + 1);
    let (name, tag) = match named[path_start..].rfind(':') {
        Some(colon) => (
            &named[..path_start + colon],
            Some(&named[path_start + colon + 1..]),
        ),
        None => (named, None),
    };
    if !is_name(name) {
        return Err(ReferenceError::Name(name.to_owned()));
    }
    if let Some(tag) = tag.filter(|tag| !is_tag(tag)) {
        return Err(ReferenceError::Tag(tag.to_owned()));
    }
    if let Some(digest) = digest.filter(|digest| !is_digest(digest)) {
        return Err(ReferenceError::Digest(digest.to_owned()));
    }
    let (registry, repository) = split_registry(name);
    if repository.len() > MAX_REPOSITORY {
        return Err(ReferenceError::RepositoryTooLong(repository.len()));
    }
    Ok(match (tag, digest) {
        (Some(tag), Some(digest)) => {
            Reference::with_tag_and_digest(registry, repository, tag.into(), digest.into())
        }
        (None, Some(digest)) => Reference::with_digest(registry, repository, digest.into()),
        (tag, None) => Reference::with_tag(registry, repository, tag.unwrap_or(DEFAULT_TAG).into()),
    })
}

/// A name: path components joined by '/', the first of which may instead be a registry host[:port]
/// followed by at least one path component.
fn is_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('/').collect();
    let rest_are_paths = |from: usize| parts[from..].iter().all(|p| is_path_component(p));
    rest_are_paths(0) || (parts.len() > 1 && is_registry(parts[0]) && rest_are_paths(1))
}

/// `[a-z0-9]+` runs joined by one '.', one '_', two '_', or any number of '-' (none included).
fn is_path_component(component: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let mut chars = component.chars().peekable();
    loop {
        // A run of letters and digits.
        let mut run = 0;
        while chars.next_if(|c| alnum(*c)).is_some() {
            run += 1;
        }
        if run == 0 {
            return false;
        }
        let separator: String = std::iter::from_fn(|| chars.next_if(|c| !alnum(*c))).collect();
        if separator.is_empty() {
            return chars.peek().is_none();
        }
        let joins =
            matches!(separator.as_str(), "." | "_" | "__") || separator.chars().all(|c| c == '-');
        if !joins || chars.peek().is_none() {
            return false;
        }
    }
}

/// A host of '.'-separated labels (letters, digits and inner '-'), then an optional `:port`.
fn is_registry(registry: &str) -> bool {
    let (host, port) = match registry.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (registry, None),
    };
    let label = |l: &str| {
        !l.is_empty()
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    host.split('.').all(label)
        && port.is_none_or(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

fn is_tag(tag: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    tag.len() <= MAX_TAG
        && tag.chars().next().is_some_and(word)
        && tag.chars().all(|c| word(c) || c == '.' || c == '-')
}

/// `algorithm:hex`, where the algorithm is sha256, sha384 or sha512 and the hex digits its length.
fn is_digest(digest: &str) -> bool {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return false;
    };
    let length = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return false,
    };
    hex.len() == length && hex.chars().all(|c| c.is_ascii_hexdigit())
}

/// The registry and the repository: the first part is a registry when it has a '.' or ':' or is
/// `localhost`; otherwise the image is on Docker Hub, where a one-part name is an official image.
fn split_registry(name: &str) -> (String, String) {
    let (registry, repository) = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => (first, rest),
        _ => (DOCKER_HUB, name),
    };
    let registry = if registry == DOCKER_HUB_LEGACY {
        DOCKER_HUB
    } else {
        registry
    };
    let repository = if registry == DOCKER_HUB && !repository.contains('/') {
        format!("{OFFICIAL_IMAGES}/{repository}")
    } else {
        repository.to_owned()
    };
    (registry.to_owned(), repository)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parts(reference: &Reference) -> (String, String, Option<String>, Option<String>) {
        (
            reference.registry().to_owned(),
            reference.repository().to_owned(),
            reference.tag().map(str::to_owned),
            reference.digest().map(str::to_owned),
        )
    }

    #[test]
    fn references_split_into_registry_repository_tag_and_digest() {
        let digest = format!("sha256:{}", "f".repeat(64));
        let cases = [
            ("busybox", "docker.io", "library/busybox", "latest"),
            ("test.com:5000", "docker.io", "library/test.com", "5000"),
            ("localhost:5000/pkg:v1", "localhost:5000", "pkg", "v1"),
            ("127.0.0.1:5000/a/b", "127.0.0.1:5000", "a/b", "latest"),
            ("index.docker.io/x", "docker.io", "library/x", "latest"),
            ("quay.io/a--b/c__d.e", "quay.io", "a--b/c__d.e", "latest"),
        ];
        for (image, registry, repository, tag) in cases {
            let want = (registry.into(), repository.into(), Some(tag.into()), None);
            assert_eq!(parts(&parse_reference(image).unwrap()), want, "{image}");
        }
        let pinned = parse_reference(&format!("quay.io/p:v1@{digest}")).unwrap();
        assert_eq!(pinned.tag(), Some("v1"));
        assert_eq!(pinned.digest(), Some(digest.as_str()));
        assert_eq!(parse_reference(&format!("p@{digest}")).unwrap().tag(), None);
    }

    #[test]
    fn bad_references_name_the_part_that_is_wrong() {
        let long = format!("a/{}", "b".repeat(260));
        let cases = [
            ("", "empty"),
            ("upper/Case", "repository name"),
            ("a..b", "repository name"),
            ("a/", "repository name"),
            ("a:b:c", "repository name"),
            ("a:-tag", "tag"),
            ("a@sha256:abc", "digest"),
            ("a@md5:0123456789abcdef0123456789abcdef", "digest"),
            (long.as_str(), "more than 255"),
        ];
        for (image, part) in cases {
            let error = parse_reference(image).unwrap_err().to_string();
            assert!(error.contains(part), "{image:?}: {error}");
        }
    }

    /// Strings of the characters references are made of, shaped like references often enough that
    /// both accepted and refused ones come up.
    fn reference_like() -> impl Strategy<Value = String> {
        // Runs of letters and digits joined by separators the grammar allows and ones it does not.
        let separator = prop_oneof![
            Just("."),
            Just("_"),
            Just("__"),
            Just("-"),
            Just("---"),
            Just(".."),
            Just("___"),
            Just("._"),
            Just("-_"),
        ];
        let component = (
            "[a-z0-9]{1,3}",
            prop::collection::vec((separator, "[a-zA-Z0-9]{0,3}"), 0..3),
        )
            .prop_map(|(first, rest)| {
                rest.into_iter()
                    .fold(first, |joined, (sep, run)| format!("{joined}{sep}{run}"))
            });
        let piece = prop_oneof![
            4 => component,
            1 => "[a-zA-Z0-9._-]{1,5}",
            1 => Just("localhost".to_owned()),
            1 => Just("example.com:5000".to_owned()),
            1 => Just("Host-1.example:80".to_owned()),
        ];
        let name = prop::collection::vec(piece, 1..4).prop_map(|p| p.join("/"));
        let tag = prop::option::of("[a-zA-Z0-9_.:-]{0,8}");
        let digest = prop::option::of(prop_oneof![
            "sha256:[0-9a-f]{64}",
            "sha512:[0-9a-fA-F]{128}",
            "sha256:[0-9a-g]{60,66}",
            "[a-z0-9]{1,6}:[0-9a-f]{32,40}",
        ]);
        (name, tag, digest).prop_map(|(name, tag, digest)| {
            let mut image = name;
            if let Some(tag) = tag {
                image = format!("{image}:{tag}");
            }
            if let Some(digest) = digest {
                image = format!("{image}@{digest}");
            }
            image
        })
    }

    proptest! {
        /// The registry client's own (regex) parser is the reference: the same strings are accepted,
        /// and split the same way.
        #[test]
        fn accepts_and_splits_what_the_registry_clients_parser_does(image in reference_like()) {
            let ours = parse_reference(&image).map(|r| parts(&r)).ok();
            let theirs = image.parse::<Reference>().map(|r| parts(&r)).ok();
            prop_assert_eq!(ours, theirs, "{}", image);
        }
    }
}
