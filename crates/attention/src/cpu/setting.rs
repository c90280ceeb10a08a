//! The crate's environment settings, part of the bottom layer ([`crate::cpu`]), all read by
//! one helper ([`parsed`]): a value that is not valid UTF-8 is an error naming the variable, as
//! is one the setting's parser refuses. The choices among names (`UNET_ATTENTION_ISA`,
//! `UNET_ATTENTION_SDPA`, `UNET_ATTENTION_LAYERS`: [`choice`]) all mean the same thing:
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

/// The setting `name` as `parse` reads its text (`None`: unset), or the error: a value that is
/// not valid UTF-8 ("expected `expected`"), or `parse`'s, each after the variable and the value.
/// The one reader of every setting ([`choice`] is this with a list of names).
pub(crate) fn parsed<T>(
    name: &str,
    expected: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, String> {
    read(name, std::env::var_os(name).as_deref(), expected, parse)
}

/// [`parsed`] on a given value (`None`: unset).
fn read<T>(
    name: &str,
    value: Option<&std::ffi::OsStr>,
    expected: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, String> {
    let Some(value) = value else { return Ok(None) };
    let Some(text) = value.to_str() else {
        return Err(format!("{name}={value:?}: not valid UTF-8; expected {expected}"));
    };
    parse(text).map(Some).map_err(|e| format!("{name}={text:?}: {e}"))
}

/// [`choice`] on a given value (`None`: unset).
fn parse<T: Copy>(name: &str, value: Option<&std::ffi::OsStr>, choices: &[(&str, T)]) -> Result<T, String> {
    let default = choices
        .first()
        .map(|c| c.1)
        .ok_or_else(|| format!("{name}: no choices"))?;
    let names = expected(choices);
    let found = read(name, value, &names, |text| {
        let wanted = text.trim().to_ascii_lowercase();
        if wanted.is_empty() {
            return Ok(default);
        }
        choices
            .iter()
            .find(|c| c.0 == wanted)
            .map(|c| c.1)
            .ok_or_else(|| format!("expected {names}"))
    })?;
    Ok(found.unwrap_or(default))
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

    use super::read;

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

    #[test]
    fn a_parsed_setting_names_the_variable_and_the_value() {
        let double = |t: &str| {
            t.parse::<u32>()
                .map(|n| 2 * n)
                .map_err(|_| "expected a number".to_string())
        };
        assert_eq!(read("N", None, "a number", double), Ok(None));
        assert_eq!(read("N", Some(OsStr::new("21")), "a number", double), Ok(Some(42)));
        assert_eq!(
            read("N", Some(OsStr::new("x")), "a number", double),
            Err(r#"N="x": expected a number"#.to_string())
        );
    }
}
