"""nbgrader configuration of the course: the repository root is the course directory."""
c = get_config()  # noqa: F821  (provided by nbgrader)

c.CourseDirectory.root = __import__("os").path.dirname(__import__("os").path.abspath(__file__))
c.CourseDirectory.course_id = "msda-triton"
c.CourseDirectory.source_directory = "assignments"
