#pragma once
// Config structs as Python classes: every field a read/write property and a
// keyword argument of __init__ whose default is the C++ struct's default
// (read from a default-constructed struct, so the two never drift), a
// readable repr, `fields` (the names, in order) and to_dict().
#include <deque>
#include <functional>
#include <map>
#include <type_traits>

#include "common.hpp"

namespace riftco_python {

template <class C>
class ConfigClass {
 public:
  ConfigClass(nb::module_& m, const char* name, const char* doc) : cls_(m, name, doc), name_(name) {}

  /// int, bool, double, path or nested config fields.
  template <class T, class Base>
  ConfigClass& field(const char* name, T Base::*member, const char* type, const char* doc = "") {
    const std::string what = "[" + name_ + "." + name + "]";
    auto set = [member, what](C& c, nb::handle v) {
      // Python's bool is an int subclass: zero_stage=True or steps=False would
      // silently be 1 or 0, so a number field refuses it (a bool field takes it).
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        c.*member = int_of<T>(v, what);  // also: an int out of range is a ValueError naming it
      } else {
        if (std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && is_bool_like(v.ptr())) throw nb::cast_error();
        c.*member = nb::cast<T>(v);
      }
    };
    // A reference (reference_internal): config.model.layers = 2 changes config.
    auto property = [member](const C& c) -> const T& { return c.*member; };
    add(name, type, property, set, [member](const C& c) { return nb::cast(c.*member, nb::rv_policy::copy); }, doc);
    return *this;
  }
  /// Path fields: None (or "") for an empty path, which means "the default"
  /// (pathlib would turn it into Path('.'), a different path).
  template <class Base>
  ConfigClass& path(const char* name, std::filesystem::path Base::*member, const char* doc = "") {
    auto get = [member](const C& c) -> nb::object {
      if ((c.*member).empty()) return nb::none();
      return nb::cast(c.*member);
    };
    auto set = [member](C& c, nb::handle v) { c.*member = v.is_none() ? "" : nb::cast<std::filesystem::path>(v); };
    add(name, "str | os.PathLike[str] | None", get, set, get, doc);
    return *this;
  }
  /// float32 fields: read back as the shortest decimal (0.003).
  template <class Base>
  ConfigClass& real(const char* name, float Base::*member, const char* doc = "") {
    auto get = [member](const C& c) { return short_double(c.*member); };
    auto set = [member](C& c, nb::handle v) {
      if (is_bool_like(v.ptr())) throw nb::cast_error();  // not a number here
      c.*member = static_cast<float>(nb::cast<double>(v));
    };
    add(name, "float", get, set, [get](const C& c) { return nb::cast(get(c)); }, doc);
    return *this;
  }
  /// Enum fields as strings ("flash", "block", ...); ValueError lists the accepted values.
  template <class E, class Base>
  ConfigClass& choice(const char* name, E Base::*member, E (*parse)(const std::string&, const char*),
                      const char* (*to_name)(E), const char* doc = "") {
    auto get = [member, to_name](const C& c) { return std::string(to_name(c.*member)); };
    const std::string what = "[" + name_ + "." + name + "]";
    auto set = [member, parse, name, what](C& c, nb::handle v) {
      if (!nb::isinstance<nb::str>(v)) throw nb::cast_error();
      c.*member = parse(choice_of(v, what), name);
    };
    add(name, "str", get, set, [get](const C& c) { return nb::cast(get(c)); }, doc);
    return *this;
  }
  /// A field with its own conversion (getter returns a Python object). `set`
  /// throws nb::cast_error for a value of the wrong type (a TypeError naming
  /// the field, as every field's).
  ConfigClass& custom(const char* name, const char* type, std::function<nb::object(const C&)> get,
                      std::function<void(C&, nb::handle)> set, const char* doc = "") {
    add(name, type, [get](const C& c) { return get(c); }, std::move(set), get, doc);
    return *this;
  }

  /// __init__(**fields), __repr__, fields, to_dict(). Call last.
  nb::class_<C>& finish() {
    auto setters = setters_;
    const std::string cls_name = name_;
    std::string sig = "def __init__(self, *";
    const C defaults{};
    for (const Field& f : fields_) {
      nb::object value = f.get(defaults);
      const bool literal = nb::isinstance<nb::int_>(value) || nb::isinstance<nb::float_>(value) ||
                           nb::isinstance<nb::str>(value) || nb::isinstance<nb::bool_>(value) || value.is_none();
      sig += ", " + f.name + ": " + f.type + " = " + (literal ? nb::cast<std::string>(nb::repr(value)) : "...");
    }
    sig += ") -> None";
    const char* stored = signatures().emplace_back(std::move(sig)).c_str();
    auto names = field_names();
    cls_.def(
        "__init__",
        [setters, cls_name, names](C* self, nb::kwargs kwargs) {
          C config{};
          for (auto [key, value] : kwargs) {
            const std::string k = nb::cast<std::string>(key);
            auto it = setters->find(k);
            if (it == setters->end()) {
              std::string list;
              for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
              throw nb::type_error((cls_name + "() got an unexpected keyword argument '" + k + "' (fields: " + list +
                                    ")")
                                       .c_str());
            }
            it->second(config, value);
          }
          new (self) C(std::move(config));
        },
        nb::sig(stored), "Every field is a keyword argument; an omitted field keeps the C++ default.");
    auto getters = fields_;
    cls_.def("__repr__", [getters, cls_name](const C& c) {
      std::string out = cls_name + "(";
      for (std::size_t i = 0; i < getters.size(); ++i) {
        out += (i ? ", " : "") + getters[i].name + "=" + nb::cast<std::string>(nb::repr(getters[i].get(c)));
      }
      return out + ")";
    });
    cls_.def("to_dict", [getters](const C& c) {
      nb::dict d;
      for (const Field& f : getters) d[f.name.c_str()] = f.get(c);
      return d;
    }, "The fields as a dict (nested configs stay objects).");
    cls_.def("__copy__", [](const C& c) { return C(c); });
    cls_.def("__deepcopy__", [](const C& c, nb::handle) { return C(c); }, "memo"_a);
    nb::list name_list;
    for (const std::string& n : names) name_list.append(n);
    cls_.attr("fields") = nb::tuple(name_list);
    return cls_;
  }

  nb::class_<C>& cls() { return cls_; }

 private:
  struct Field {
    std::string name;
    std::string type;
    std::function<nb::object(const C&)> get;
  };
  /// One conversion for a keyword and an assignment alike: a value of the
  /// wrong type (nb::cast_error) is a TypeError naming the field (was
  /// nanobind's anonymous "incompatible function arguments" for assignments).
  template <class Property>
  void add(const char* name, const char* type, Property property, std::function<void(C&, nb::handle)> set,
           std::function<nb::object(const C&)> get, const char* doc) {
    const std::string label = name_ + "." + name + " expects " + type;
    auto checked = [set = std::move(set), label](C& c, nb::handle v) {
      try {
        set(c, v);
      } catch (const nb::cast_error&) {
        throw nb::type_error((label + ", got " + nb::cast<std::string>(nb::str(v.type().attr("__name__")))).c_str());
      }
    };
    (*setters_)[name] = checked;
    cls_.def_prop_rw(name, property, [checked](C& c, nb::handle v) { checked(c, v); },
                     nb::for_setter(nb::arg("value").none()), doc);  // None reaches `checked` too
    fields_.push_back({name, type, std::move(get)});
  }
  std::vector<std::string> field_names() const {
    std::vector<std::string> out;
    for (const Field& f : fields_) out.push_back(f.name);
    return out;
  }
  static std::deque<std::string>& signatures() {
    static std::deque<std::string> stored;  // nb::sig keeps the pointer
    return stored;
  }

  nb::class_<C> cls_;
  std::string name_;
  std::shared_ptr<std::map<std::string, std::function<void(C&, nb::handle)>>> setters_ =
      std::make_shared<std::map<std::string, std::function<void(C&, nb::handle)>>>();
  std::vector<Field> fields_;
};

}  // namespace riftco_python
