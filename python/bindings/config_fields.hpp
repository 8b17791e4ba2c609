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
    const std::string label = name_ + "." + name + " expects " + type;
    auto set = [member, label](C& c, nb::handle v) {
      // Python's bool is an int subclass: zero_stage=True or steps=False would
      // silently be 1 or 0, so an int field refuses it (a bool field takes it).
      const bool bool_for_number = std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && nb::isinstance<nb::bool_>(v);
      try {
        if (bool_for_number) throw nb::cast_error();
        c.*member = nb::cast<T>(v);
      } catch (const nb::cast_error&) {  // a TypeError naming the field, for keywords and attributes alike
        throw nb::type_error((label + ", got " + nb::cast<std::string>(nb::str(v.type().attr("__name__")))).c_str());
      }
    };
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      cls_.def_prop_rw(
          name, [member](const C& c) { return c.*member; }, [set](C& c, nb::handle v) { set(c, v); },
          nb::for_setter(nb::arg("value").none()), doc);  // None reaches `set`: its TypeError names the field
    } else {
      cls_.def_rw(name, static_cast<T C::*>(member), doc);
    }
    add(name, type, set, [member](const C& c) { return nb::cast(c.*member, nb::rv_policy::copy); });
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
    auto set = [member](C& c, std::optional<std::filesystem::path> v) { c.*member = v.value_or(""); };
    cls_.def_prop_rw(name, get, set, doc);
    add(name, "str | os.PathLike[str] | None", [set](C& c, nb::handle v) {
      set(c, v.is_none() ? std::nullopt : std::optional(nb::cast<std::filesystem::path>(v)));
    }, get);
    return *this;
  }
  /// float32 fields: read back as the shortest decimal (0.003).
  template <class Base>
  ConfigClass& real(const char* name, float Base::*member, const char* doc = "") {
    auto get = [member](const C& c) { return short_double(c.*member); };
    const std::string label = name_ + "." + name + " expects float";
    auto set = [member, label](C& c, nb::handle v) {
      if (nb::isinstance<nb::bool_>(v)) throw nb::type_error((label + ", got bool").c_str());  // not a number here
      try {
        c.*member = static_cast<float>(nb::cast<double>(v));
      } catch (const nb::cast_error&) {
        throw nb::type_error((label + ", got " + nb::cast<std::string>(nb::str(v.type().attr("__name__")))).c_str());
      }
    };
    cls_.def_prop_rw(name, get, [set](C& c, nb::handle v) { set(c, v); }, nb::for_setter(nb::arg("value").none()), doc);
    add(name, "float", set, [get](const C& c) { return nb::cast(get(c)); });
    return *this;
  }
  /// Enum fields as strings ("flash", "block", ...); ValueError lists the accepted values.
  template <class E, class Base>
  ConfigClass& choice(const char* name, E Base::*member, E (*parse)(const std::string&, const char*),
                      const char* (*to_name)(E), const char* doc = "") {
    auto get = [member, to_name](const C& c) { return std::string(to_name(c.*member)); };
    auto set = [member, parse, name](C& c, const std::string& v) { c.*member = parse(v, name); };
    cls_.def_prop_rw(name, get, set, doc);
    add(name, "str", [set](C& c, nb::handle v) { set(c, nb::cast<std::string>(v)); },
        [get](const C& c) { return nb::cast(get(c)); });
    return *this;
  }
  /// A field with its own conversion (getter returns a Python object).
  ConfigClass& custom(const char* name, const char* type, std::function<nb::object(const C&)> get,
                      std::function<void(C&, nb::handle)> set, const char* doc = "") {
    cls_.def_prop_rw(name, [get](const C& c) { return get(c); }, [set](C& c, nb::handle v) { set(c, v); }, doc);
    add(name, type, set, get);
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
  void add(const char* name, const char* type, std::function<void(C&, nb::handle)> set,
           std::function<nb::object(const C&)> get) {
    // Every keyword argument: a value of the wrong type is a TypeError naming
    // the field (float, path and choice fields too; was RuntimeError std::bad_cast).
    const std::string label = name_ + "." + name + " expects " + type;
    (*setters_)[name] = [set = std::move(set), label](C& c, nb::handle v) {
      try {
        set(c, v);
      } catch (const nb::cast_error&) {
        throw nb::type_error((label + ", got " + nb::cast<std::string>(nb::str(v.type().attr("__name__")))).c_str());
      }
    };
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
