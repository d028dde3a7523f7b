//! What may reach a log or an error message of outside text: URLs without the credentials a
//! user may have written into them (`https://user:pass@bmc/`).

/// The URL with any `user:password@` replaced by `<redacted>@` (text that is not a URL is
/// returned as it is).
pub fn url(s: &str) -> String {
    let Some(scheme_end) = s.find("://") else {
        return s.to_string();
    };
    let rest = &s[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{}://<redacted>@{}", &s[..scheme_end], &rest[at + 1..]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn credentials_in_urls_are_redacted() {
        assert_eq!(
            super::url("https://admin:s3cr%40t@10.0.0.1:443/redfish/v1"),
            "https://<redacted>@10.0.0.1:443/redfish/v1"
        );
        assert_eq!(super::url("http://u@h/p@q"), "http://<redacted>@h/p@q");
        assert_eq!(
            super::url("https://bmc/redfish/v1"),
            "https://bmc/redfish/v1"
        );
        assert_eq!(super::url("/redfish/v1/Chassis"), "/redfish/v1/Chassis");
        assert_eq!(super::url("ü://ä@ö"), "ü://<redacted>@ö");
    }
}
