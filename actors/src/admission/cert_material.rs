//! The webhook's certificates as data: a private CA and a serving certificate it signs (rcgen), how they
//! are stored in a Secret, and when they are due for renewal. No I/O: `serving_cert` reads and writes
//! the Secret and serves what this issues.

use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use pko_proto::well_known::{
    WEBHOOK_CA_NOT_AFTER_ANNOTATION, WEBHOOK_CERT_NAMES_ANNOTATION,
    WEBHOOK_CERT_NOT_AFTER_ANNOTATION,
};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

pub const CA_CERT: &str = "ca.crt";

pub const CA_KEY: &str = "ca.key";

pub const TLS_CERT: &str = "tls.crt";

pub const TLS_KEY: &str = "tls.key";

pub const DAY: u64 = 24 * 60 * 60;

pub const CA_VALIDITY: u64 = 10 * 365 * DAY;

pub const SERVING_VALIDITY: u64 = 365 * DAY;

/// A certificate this close to its end is replaced: a third of the serving lifetime leaves months for a
/// failing renewal to be noticed.
pub const RENEW_BEFORE: u64 = 120 * DAY;

/// The PEM material of one Secret, with its validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertMaterial {
    pub ca_cert: String,
    pub ca_key: String,
    pub ca_not_after: u64,
    pub cert: String,
    pub key: String,
    pub not_after: u64,
    pub names: Vec<String>,
}

impl CertMaterial {
    pub fn from_secret(secret: &Secret) -> Option<Self> {
        let data = secret.data.as_ref()?;
        let text = |key: &str| {
            data.get(key)
                .and_then(|b| String::from_utf8(b.0.clone()).ok())
        };
        let annotations = secret.metadata.annotations.as_ref()?;
        let number = |key: &str| annotations.get(key)?.parse().ok();
        Some(Self {
            ca_cert: text(CA_CERT)?,
            ca_key: text(CA_KEY)?,
            ca_not_after: number(WEBHOOK_CA_NOT_AFTER_ANNOTATION)?,
            cert: text(TLS_CERT)?,
            key: text(TLS_KEY)?,
            not_after: number(WEBHOOK_CERT_NOT_AFTER_ANNOTATION)?,
            names: annotations
                .get(WEBHOOK_CERT_NAMES_ANNOTATION)?
                .split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }

    pub fn to_secret(&self, meta: ObjectMeta) -> Secret {
        let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
        let mut meta = meta;
        let annotations = meta.annotations.get_or_insert_with(Default::default);
        annotations.insert(
            WEBHOOK_CA_NOT_AFTER_ANNOTATION.to_owned(),
            self.ca_not_after.to_string(),
        );
        annotations.insert(
            WEBHOOK_CERT_NOT_AFTER_ANNOTATION.to_owned(),
            self.not_after.to_string(),
        );
        annotations.insert(
            WEBHOOK_CERT_NAMES_ANNOTATION.to_owned(),
            self.names.join(","),
        );
        Secret {
            metadata: meta,
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(
                [
                    (CA_CERT.to_owned(), bytes(&self.ca_cert)),
                    (CA_KEY.to_owned(), bytes(&self.ca_key)),
                    (TLS_CERT.to_owned(), bytes(&self.cert)),
                    (TLS_KEY.to_owned(), bytes(&self.key)),
                ]
                .into(),
            ),
            ..Default::default()
        }
    }

    /// What must be issued anew at `now` for `names`: nothing, the serving certificate, or everything.
    pub fn renewal(&self, now: u64, names: &[String]) -> Renewal {
        if self.ca_not_after <= now + RENEW_BEFORE || KeyPair::from_pem(&self.ca_key).is_err() {
            Renewal::All
        } else if self.not_after <= now + RENEW_BEFORE || self.names != names {
            Renewal::Serving
        } else {
            Renewal::None
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Renewal {
    None,
    Serving,
    All,
}

/// The CA's parameters; rebuilt identically to sign with a stored CA key, so its certificate need not
/// be parsed back.
pub fn ca_params(now: u64) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "pko admission webhook CA");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = offset_time(now.saturating_sub(DAY));
    params.not_after = offset_time(now + CA_VALIDITY);
    Ok(params)
}

pub fn offset_time(unix: u64) -> time::OffsetDateTime {
    let seconds = i64::try_from(unix).unwrap_or(i64::MAX);
    time::OffsetDateTime::from_unix_timestamp(seconds).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

pub fn issue_all(now: u64, names: &[String]) -> Result<CertMaterial, rcgen::Error> {
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params(now)?.self_signed(&ca_key)?.pem();
    let ca_key = ca_key.serialize_pem();
    issue_serving(ca_cert, ca_key, now + CA_VALIDITY, now, names)
}

pub fn issue_serving(
    ca_cert: String,
    ca_key: String,
    ca_not_after: u64,
    now: u64,
    names: &[String],
) -> Result<CertMaterial, rcgen::Error> {
    let issuer = Issuer::new(ca_params(now)?, KeyPair::from_pem(&ca_key)?);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    let mut subject = DistinguishedName::new();
    subject.push(
        DnType::CommonName,
        names.first().cloned().unwrap_or_default(),
    );
    params.distinguished_name = subject;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let not_after = (now + SERVING_VALIDITY).min(ca_not_after);
    params.not_before = offset_time(now.saturating_sub(DAY));
    params.not_after = offset_time(not_after);
    let cert = params.signed_by(&key, &issuer)?.pem();
    Ok(CertMaterial {
        ca_cert,
        ca_key,
        ca_not_after,
        cert,
        key: key.serialize_pem(),
        not_after,
        names: names.to_vec(),
    })
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["pko-webhook.pko.svc".to_owned(), "127.0.0.1".to_owned()]
    }

    #[test]
    fn renewal_is_due_near_expiry_or_for_other_names() {
        let now = unix_now();
        let material = issue_all(now, &names()).unwrap();
        assert_eq!(material.renewal(now, &names()), Renewal::None);
        assert_eq!(
            material.renewal(now, &["other.svc".to_owned()]),
            Renewal::Serving
        );
        let late = material.not_after - RENEW_BEFORE + 1;
        assert_eq!(material.renewal(late, &names()), Renewal::Serving);
        let very_late = material.ca_not_after - RENEW_BEFORE + 1;
        assert_eq!(material.renewal(very_late, &names()), Renewal::All);
    }

    #[test]
    fn a_renewed_serving_certificate_keeps_the_ca() {
        let now = unix_now();
        let first = issue_all(now, &names()).unwrap();
        let renewed = issue_serving(
            first.ca_cert.clone(),
            first.ca_key.clone(),
            first.ca_not_after,
            now + 300 * DAY,
            &names(),
        )
        .unwrap();
        assert_eq!(renewed.ca_cert, first.ca_cert);
        assert_ne!(renewed.cert, first.cert);
        assert!(renewed.not_after <= renewed.ca_not_after);
    }

    #[test]
    fn a_secret_missing_a_key_is_not_material() {
        let material = issue_all(unix_now(), &names()).unwrap();
        let mut secret = material.to_secret(ObjectMeta::default());
        secret.data.as_mut().unwrap().remove(TLS_KEY);
        assert!(CertMaterial::from_secret(&secret).is_none());
    }
}
