//! The oldest Kubernetes pko runs on, and the check the manager makes of its apiserver before it does
//! anything else: below the floor the CRDs' validation rules (immutable fields, the HostedClusterPackage
//! rules) would not be enforced, so the manager refuses to start rather than run unguarded.

use k8s_openapi::apimachinery::pkg::version::Info;

/// Kubernetes 1.27: OpenShift 4.14, the oldest release HyperShift management clusters run. CRD validation
/// rules are on by default since 1.25, and every API pko uses is served from 1.27 on.
pub const MINIMUM_MINOR: u32 = 27;

/// Why the apiserver's version is not one pko runs on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlatformVersionError {
    #[error("the apiserver reports Kubernetes {found}; pko needs 1.{MINIMUM_MINOR} or newer (CRD validation rules guard its immutable fields)")]
    TooOld { found: String },
    #[error("the apiserver reports a version pko cannot read (major {major:?}, minor {minor:?}, gitVersion {git:?})")]
    Unreadable {
        major: String,
        minor: String,
        git: String,
    },
}

/// Checks the apiserver's `/version`; `Ok` with `major.minor` when pko runs on it. Vendors append to
/// the minor (`27+` on some distributions), so only its leading digits count.
pub fn check(info: &Info) -> Result<(u32, u32), PlatformVersionError> {
    let number = |text: &str| -> Option<u32> {
        let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let (Some(major), Some(minor)) = (number(&info.major), number(&info.minor)) else {
        return Err(PlatformVersionError::Unreadable {
            major: info.major.clone(),
            minor: info.minor.clone(),
            git: info.git_version.clone(),
        });
    };
    if major > 1 || (major == 1 && minor >= MINIMUM_MINOR) {
        Ok((major, minor))
    } else {
        Err(PlatformVersionError::TooOld {
            found: info.git_version.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(major: &str, minor: &str, git: &str) -> Info {
        Info {
            major: major.into(),
            minor: minor.into(),
            git_version: git.into(),
            ..Default::default()
        }
    }

    #[test]
    fn accepts_the_floor_and_newer() {
        assert_eq!(check(&info("1", "27", "v1.27.16")), Ok((1, 27)));
        assert_eq!(check(&info("1", "37", "v1.37.2")), Ok((1, 37)));
        assert_eq!(check(&info("1", "29+", "v1.29.6+abc")), Ok((1, 29)));
    }

    #[test]
    fn refuses_older_naming_the_version() {
        let error = check(&info("1", "26", "v1.26.15")).unwrap_err();
        assert!(error.to_string().contains("v1.26.15"), "{error}");
        assert!(error.to_string().contains("1.27 or newer"), "{error}");
        assert!(matches!(
            check(&info("1", "20", "v1.20.2")),
            Err(PlatformVersionError::TooOld { .. })
        ));
    }

    #[test]
    fn unreadable_versions_are_named() {
        let error = check(&info("", "x", "weird")).unwrap_err();
        assert!(error.to_string().contains("weird"), "{error}");
    }
}
