//! The crate's environment settings (`UNET_ATTENTION_ISA`, `UNET_ATTENTION_SDPA`,
//! `UNET_ATTENTION_LAYERS`), read by one helper so that all three mean the same thing:
//!
//! * unset, or blank: the first choice (`auto`);
//! * one of the choices' names, in any case, surrounding whitespace ignored: that choice;
//! * anything else, a value that is not valid UTF-8 included: an error naming the variable, the
//!   value found and the values expected. The caller keeps the error and returns it from every
//!   call that reads the setting, never falling back to `auto` silently.

/// The setting `name` among `choices` (`(name, value)` pairs, the default first).
pub(crate) fn choice<T: Copy>(name: &str, choices: &[(&str, T)]) -> Result<T, String> {
    parse(name, std::env::var_os(name).as_deref(), choices)
}

/// [`choice`] on a given value (`None`: unset).
fn parse<T: Copy>(name: &str, value: Option<&std::ffi::OsStr>, choices: &[(&str, T)]) -> Result<T, String> {
    let default = choices
        .first()
        .map(|c| c.1)
        .ok_or_else(|| format!("{name}: no choices"))?;
    let Some(value) = value else { return Ok(default) };
    let Some(text) = value.to_str() else {
        return Err(format!(
            "{name}={value:?}: not valid UTF-8; expected {}",
            expected(choices)
        ));
    };
    let wanted = text.trim().to_ascii_lowercase();
    if wanted.is_empty() {
        return Ok(default);
    }
    choices
        .iter()
        .find(|c| c.0 == wanted)
        .map(|c| c.1)
        .ok_or_else(|| format!("{name}={text:?}: expected {}", expected(choices)))
}

/// "a, b or c".
fn expected<T>(choices: &[(&str, T)]) -> String {
    let names: Vec<&str> = choices.iter().map(|c| c.0).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.to_string(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::parse;
    use std::ffi::OsStr;

    const CHOICES: [(&str, u8); 3] = [("auto", 0), ("avx2", 1), ("none", 2)];

    #[test]
    fn unset_blank_and_names() {
        assert_eq!(parse("V", None, &CHOICES), Ok(0));
        assert_eq!(parse("V", Some(OsStr::new("  ")), &CHOICES), Ok(0));
        assert_eq!(parse("V", Some(OsStr::new(" AVX2 ")), &CHOICES), Ok(1));
        assert_eq!(parse("V", Some(OsStr::new("none")), &CHOICES), Ok(2));
    }

    #[test]
    fn other_values_are_errors() {
        assert_eq!(
            parse("V", Some(OsStr::new("sse")), &CHOICES),
            Err(r#"V="sse": expected auto, avx2 or none"#.to_string())
        );
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_is_an_error_not_auto() {
        use std::os::unix::ffi::OsStrExt;
        let err = parse("V", Some(OsStr::from_bytes(b"avx\xff")), &CHOICES).unwrap_err();
        assert!(
            err.starts_with("V=") && err.contains("not valid UTF-8; expected auto, avx2 or none"),
            "{err}"
        );
    }
}
